"""``grow_group``: the survivors admit the processes that replace lost ranks (a heal).

Under ``ndistrun --on-failure replace`` the launcher starts a new process in a lost rank's
place; its ``init_process_group`` queues it in the job's store and waits (``_heal``,
``_world._join_running_job``). The survivors, once they have shrunk (``shrink_group``), call
``grow_group()`` at a step boundary, every member of the default group alike:

1. **Check**, before any message: ``timeout`` (``TypeError`` / ``ValueError``); its backends
   can be rebuilt from the store (socket); the job can heal (launched by ``ndistrun``, this is
   its first ``init_process_group``). A default group that knows of a lost member raises its
   ``DistRankFailureError`` (shrink first), but only after step 2, where it proposes nobody:
   another member that did not know of the loss yet may have decided a grow already, and
   then this one makes it too (its grown group is revoked at birth, and every member shrinks
   that one); the members' grow counts stay equal.
2. **Agree** on who is admitted: the first survivor to arrive proposes the ``g``-th grow of
   the job with one ``compare_set``: every newcomer queued at that moment that no earlier
   grow admitted. Every survivor adopts the same decision. Nobody waiting: the decision is
   empty, the call returns ``[]`` (that one round trip is its whole cost). A survivor that
   knows of a lost member proposes an abort naming it instead (see the comment in
   ``grow_group``), which every survivor that adopts it raises.
3. **Rebuild**: the new default group numbers the survivors first, in their order (their
   ranks do not change), then the newcomers in the order they came; it has a numbering of
   its own (``<numbering>g<g>``) and a store namespace of its own. Every other group is
   destroyed (as after a shrink: rebuild them with ``new_group`` / ``split_group``). The
   member watch adds the newcomers.
4. **Ready**: every member (newcomers too, in their ``init_process_group``) says it is ready;
   the call returns the newcomers' ranks once all are. A member lost before that (a survivor,
   or a newcomer that died while it waited) is named in a ``DistRankFailureError``: the
   grown group is the default group, revoked; every member shrinks it (``shrink_group()``)
   and may grow again.
"""

from __future__ import annotations

import logging
from typing import Any

from ._errors import DistRankFailureError
from ._group import ProcessGroup
from ._heal import admit, await_ready, joiner_info, lost_error, newcomer_rank, propose, read_queue, ready
from ._shrink import check_backends
from ._timeout import check_timeout
from ._world import _world, resolve_group
from .store import PrefixStore

__all__ = ["grow_group"]

log = logging.getLogger("ndist.runtime.grow")


def grow_group(timeout: Any = None) -> list[int]:
    """Admit every process waiting to join the job (started in a lost rank's place by
    ``ndistrun --on-failure replace``) into the default group; called by every member of the
    default group, at a step boundary. Returns the newcomers' ranks in the new default group
    (after the survivors', whose ranks do not change); ``[]`` when nobody waits. ``timeout``
    (a ``timedelta`` or seconds; default: the group's): how long every member may take to be
    ready. Other groups are destroyed, as by ``shrink_group`` on the default group."""
    with _world.lock:
        pg = resolve_group(None)
        seconds = check_timeout(timeout, pg.timeout).total_seconds()
        pg.require_member("grow_group")
        check_backends(pg, "grow_group")
        if _world.heal is None or _world.watch is None:
            raise ValueError("grow_group: expected a job launched by ndistrun (--on-failure replace) whose default "
                             "group comes from its first init_process_group, with at least 2 ranks; got "
                             + ("a job without the launcher's store or member watch" if _world.watch is None
                                else "a later init_process_group of this process"))
        error = pg.failure()
        lost = {g: how for g, how in _world.lost.items() if g in pg.ranks}
        if error is None and lost:
            error = DistRankFailureError(
                f"grow_group: the default group {pg.group_name!r} has lost members {sorted(lost)}; call "
                "shrink_group() first", failed_ranks=sorted(lost), hosts=[lost[g][0] for g in sorted(lost)],
                causes=[lost[g][1] for g in sorted(lost)], rank=min(lost), host=lost[min(lost)][0])
        # A member that knows of a loss takes part in the agreement all the same (heal trial
        # seeds 450011, 450024): it proposes an *abort* naming the loss, which every member
        # that adopts it raises too, so that none goes on growing the group the others shrink.
        # A decision made already that admits newcomers, it makes too (its grown group is then
        # revoked at birth: every member shrinks that one). One made already that admits nobody
        # (its proposer did not know of the loss: the others return [] and may call grow_group
        # again before any operation shows them the loss), it passes, proposing its abort for
        # the next grow. A decision made for another default group than the caller's (an abort
        # that some members never reached: they learnt the loss by an operation and shrank) is
        # passed over; every member's grow count stays the same.
        heal = _world.heal
        world = _world.base_size
        while True:
            g = _world.grows
            queued = read_queue(heal)[_world.admitted:] if error is None else []
            infos = [joiner_info(heal, t) for t in queued]
            proposal = {
                "group": pg.group_name, "joiners": queued, "queue_from": _world.admitted,
                "infos": [i["watch"] for i in infos], "replaces": [i["replaces"] for i in infos], "world": world,
                "members": list(_world.job_ranks) + [newcomer_rank(world, _world.admitted + i)
                                                     for i in range(len(queued))],
                "name": f"{pg.group_name}:grow{g}", "numbering": f"{_world.numbering}g{g}",
                "group_count": _world.group_count,
            }
            if error is not None:
                failed = list(getattr(error, "failed_ranks", None) or [])
                proposal["abort"] = {"message": str(error), "failed_ranks": failed,
                                     "hosts": list(getattr(error, "hosts", None) or ["?"] * len(failed)),
                                     "causes": list(getattr(error, "causes", None) or ["lost"] * len(failed))}
            decision = propose(heal, g, proposal)
            _world.grows = g + 1
            if decision.get("group", pg.group_name) != pg.group_name:
                continue  # (stale: made for a default group this member no longer has)
            joiners = list(decision["joiners"])
            _world.admitted = int(decision["queue_from"]) + len(joiners)
            if joiners:
                break
            abort = decision.get("abort")
            if abort is not None:
                if error is None:
                    error = DistRankFailureError(
                        f"grow_group: another member of the default group {pg.group_name!r} found it lost members "
                        f"{abort['failed_ranks']}; call shrink_group() first ({abort['message']})",
                        failed_ranks=abort["failed_ranks"], hosts=abort["hosts"], causes=abort["causes"],
                        rank=abort["failed_ranks"][0] if abort["failed_ranks"] else None,
                        host=abort["hosts"][0] if abort["hosts"] else None)
                raise error
            if error is None:
                log.debug("grow_group %d: nobody waits to join", g)
                return []
        admit(heal, g, joiners)  # (every survivor: one that decided may die right after)
        new = _rebuild(pg, decision)
        watch = _world.watch
    first = int(decision["queue_from"])
    watch.add_members({newcomer_rank(world, first + i): info for i, info in enumerate(decision["infos"])})
    ready(heal, g, new.rank())
    gone = await_ready(heal, g, new.size(), lambda: dict(_world.lost), seconds, f"grow_group on rank {new.rank()}")
    if gone:
        raise lost_error(f"grow_group on rank {new.rank()}", new.group_name, gone)
    n_old = len(decision["members"]) - len(joiners)
    joined = list(range(n_old, new.size()))
    log.info("grow_group %d: admitted ranks %s (replacing ranks %s); the default group %r has %d ranks", g, joined,
             decision["replaces"], new.group_name, new.size())
    return joined


def _rebuild(pg: ProcessGroup, decision: dict) -> ProcessGroup:
    """Step 3 (under the world's lock): the grown default group, the others destroyed."""
    for other in [g for g in _world.groups.values() if g is not pg]:
        other._shutdown(abort=True)
    pg._shutdown()
    members, name = [int(r) for r in decision["members"]], str(decision["name"])
    with _world.numbering_lock:  # (the watch's thread tells a loss in one numbering)
        _world.job_ranks = tuple(members)  # (the survivors' global ranks do not change)
        _world.numbering = str(decision["numbering"])
        _world.shrinking = {}
        new = ProcessGroup(tuple(range(len(members))), pg.rank(), name, PrefixStore(name, _world.job_store),
                           pg.backend_names, pg.timeout, pg.options)
        new.numbering = _world.numbering
        _world.default = new
        _world.groups = {name: new}
    new.device_id = pg.device_id
    new.group_desc = f"{pg.group_desc or pg.group_name}:grown"
    for grank, (host, cause, detail) in dict(_world.lost).items():  # (lost meanwhile: revoked at birth)
        new.note_loss(grank, host, cause, detail)
    return new
