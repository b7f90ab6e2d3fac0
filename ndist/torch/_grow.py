"""``ndist.torch.grow_group``: a heal through torch (``ndistrun --on-failure replace``).

torch has no grow: 2.13 and 2.14 shrink (``torch.distributed.shrink_group``), and 2.14's
experimental reconfigure contract (``enable_reconfigure``, ``ProcessGroup.reconfigure``) is
a C++ ``Backend`` hook that Gloo implements for torchft's Manager; backend ``"ndist"``'s
groups are Python ``ProcessGroup``s and torch 2.13 has no such hook. What both releases do
offer, publicly, is to destroy the default group and make a new one
(``destroy_process_group`` + ``init_process_group(store=, rank=, world_size=)``). So the heal
through torch is ndist's grow (``runtime/_grow.py``) with that last step:

1. **Check**, before any message: ``timeout`` (``TypeError`` / ``ValueError``); torch's default
   group is on backend ``"ndist"`` and knows of no lost member (``get_failed_ranks``: shrink
   first, ``torch.distributed.shrink_group``); the job was launched by ``ndistrun`` and the
   default group came from its first ``ndist://`` rendezvous (``_rendezvous.heal_state``).
2. **Agree**, as ndist's grow (``runtime/_heal.py``'s keys, in ``ndist.torch/<restart>/heal``):
   the first member to arrive proposes the ``g``-th grow, every newcomer queued then and not
   yet admitted; nobody waiting: ``[]``, one round trip.
3. **Hold**: every member says it adopted the decision and waits for all (the same wait as
   ndist's grow's ready step, on the default group's losses): no member leaves the old group
   while another may still use it. A member lost before that is named
   (``DistNetworkError`` with ``failed_ranks``, as torch's errors cross: ``as_torch_error``);
   nobody was admitted, the old group is still the default group, revoked: shrink, and grow
   again (the same newcomers are proposed again).
4. **Rebuild**: the newcomers are told they are admitted; every member destroys torch's
   default group (every other group with it, as torch does) and makes the grown one through
   ``init_process_group(store=...)`` on a store namespace of its own: the members first, in
   their order (their ranks do not change), then the newcomers in the order they came. A
   newcomer's ``init_process_group(init_method="ndist://")`` returns into the same group
   (``_rendezvous._join_running_job``). The new default group starts a member watch of its
   own (``_watch.start``), so a member lost from here on is named by the grown group's
   first collective; every member then shrinks and may grow again.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

import torch.distributed as tdist
from torch.distributed import distributed_c10d as c10d

from ..runtime import DistRankFailureError
from ..runtime import DistTimeoutError
from ..runtime._timeout import check_timeout
from ..runtime._heal import admit, lost_error, propose, read_queue
from ..runtime.store import PrefixStore
from . import _compiled, _rendezvous
from ._group import BACKEND_NAME
from ._shrink import get_failed_ranks
from ._work import as_torch_error

__all__ = ["grow_group", "joined_running_job"]

log = logging.getLogger("ndist.torch.grow")

_POLL_S = 0.05


def _hold(store: Any, g: int, me: int, size: int, timeout: float, what: str) -> dict:
    """Step 3: say this member adopted grow ``g``, and wait until every member of the default
    group did; ``{}`` then, or at once the members (group ranks) that did not and are known
    lost (group rank -> (host, cause, detail)). A member that did may leave the group at once
    (it goes on to rebuild): its end is no loss here."""
    keys = [f"grow/{g}/adopted/{r}" for r in range(size)]
    store.set(keys[me], "1")
    deadline = time.monotonic() + timeout
    while True:
        try:
            store.wait(keys, timedelta(seconds=_POLL_S))
            return {}
        except DistTimeoutError:
            pass
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        if not missing:
            return {}
        gone = {r: ("?", "lost", "") for r in get_failed_ranks() if r in missing}
        if gone:
            return gone
        if time.monotonic() >= deadline:
            raise DistTimeoutError(f"{what}: ranks {missing} did not come to the grow within {timeout:g} s")


def joined_running_job() -> bool:
    """True in a process whose ``init_process_group("ndist", init_method="ndist://")`` joined a
    running job: started in a lost rank's place (``ndistrun --on-failure replace``) and
    admitted by the members' ``grow_group``; it must receive the job's state from them."""
    state = _rendezvous.heal_state()
    return state is not None and state.joined and tdist.is_initialized()


def grow_group(timeout: Any = None, pg_options: Any = None) -> list[int]:
    """Admit every process waiting to join the job (started in a lost rank's place by
    ``ndistrun --on-failure replace``) into torch's default group; called by every member of
    the default group (backend ``"ndist"``, made through ``ndist://``) at a step boundary.
    Returns the newcomers' ranks in the new default group (after the members', whose ranks do
    not change); ``[]`` when nobody waits. ``timeout`` (a ``timedelta`` or seconds; default:
    the group's): how long every member may take to come. ``pg_options``: the new default
    group's (``ndist.torch.Options``; None: the defaults). Every other group is destroyed
    (rebuild them with ``new_group``), as by ``torch.distributed.shrink_group``. See the module
    doc for what a loss during the grow gives."""
    if not tdist.is_initialized():
        raise ValueError("grow_group: expected torch.distributed's default process group, got none "
                         "(call init_process_group first)")
    pg = c10d._get_default_group()
    group = _compiled.python_group(pg)
    nd = getattr(group, "ndist_group", None)
    if nd is None or tdist.get_backend() != BACKEND_NAME:
        raise ValueError(f"grow_group: expected a default group on backend {BACKEND_NAME!r}, got backend "
                         f"{tdist.get_backend()!r}")
    seconds = check_timeout(timeout, nd.timeout)
    state = _rendezvous.heal_state()
    if state is None:
        raise ValueError("grow_group: expected a job launched by ndistrun (--on-failure replace) whose default group "
                         "comes from its first init_process_group(init_method='ndist://'), got "
                         "a job without the launcher's store")
    failed = get_failed_ranks()
    me, size = tdist.get_rank(), tdist.get_world_size()
    g = state.grows
    # (a member that knows of a loss proposes nobody, and follows a decision made already:
    # the hold below then names the loss on every member; ndist's grow does the same)
    queued = read_queue(state.heal)[state.admitted:] if not failed else []
    proposal = {"joiners": queued, "queue_from": state.admitted, "survivors": size}
    decision = propose(state.heal, g, proposal)
    state.grows = g + 1
    joiners = list(decision["joiners"])
    if not joiners and failed:
        err = DistRankFailureError(f"grow_group: the default group has lost members {failed}; call "
                                   "torch.distributed.shrink_group first", failed_ranks=failed, rank=failed[0])
        raise as_torch_error(err) from err
    if not joiners:
        log.debug("torch grow_group %d: nobody waits to join", g)
        return []
    what = f"grow_group on rank {me}"
    gone = _hold(PrefixStore("adopted", state.heal), g, me, size, seconds.total_seconds(), what)
    if gone:  # nobody admitted: the next grow proposes the same newcomers
        err = lost_error(what, pg.group_name, gone)
        raise as_torch_error(err) from err
    admit(state.heal, g, joiners)
    state.admitted = int(decision["queue_from"]) + len(joiners)
    grown = size + len(joiners)
    state.numbering = f"torch-grow{g}"  # (the grown group's ranks name other processes: _rendezvous)
    tdist.destroy_process_group()
    # (the prefix torch's init_process_group gives a rendezvous's store, as the newcomer's has)
    store = tdist.PrefixStore("default_pg", state.store_of(g, seconds))
    tdist.init_process_group(BACKEND_NAME, store=store, rank=me, world_size=grown, timeout=seconds,
                             pg_options=pg_options)
    log.info("torch grow_group %d: admitted ranks %s; the default group has %d ranks", g,
             list(range(size, grown)), grown)
    return list(range(size, grown))
