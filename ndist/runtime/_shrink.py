"""``shrink_group``: the survivors of a group agree on who is gone and carry on without them.

torch 2.13's ``torch.distributed.shrink_group(ranks_to_exclude, group, shrink_flags)``
on ndist's own groups (any backend whose members can be rebuilt from the group's
store: socket; see docs/errors.md for mpi and nccl). The steps:

1. **Check** the arguments, before any message: ``ValueError`` / ``TypeError`` for a
   rank out of range, a duplicate, the caller itself, every rank, a bad flag.
2. **Agree** through the group's store. Survivors may have seen different losses.
   Each survivor posts the set it knows (``seen/<rank>``: its ``ranks_to_exclude``,
   or the losses the member watch told of, and every set another survivor posted),
   and re-posts it whenever it grows: a loss its watch reports, or one another
   survivor posted (so a survivor that has not seen a loss yet learns of it here).
   A survivor that has heard from every rank outside its set, and whose set holds
   every set they posted, proposes it as the decision with one ``compare_set``:
   the first proposal wins, and every survivor adopts it. A rank of the decision
   that calls ``shrink_group`` itself was excluded while alive: the proposal says
   so instead, and every caller raises ``ValueError``, nothing changed. Beside its
   set, each survivor posts the ranks it knows are *lost* (its watch's record, and
   what the others posted as lost): a rank that posted and then died is alive to
   nobody once one survivor's watch saw it go, even before the others' watches did.
   Both sets take only the member watch's losses (``_World.lost``; a torch group's:
   its own watch's, ``ProcessGroup.watched_losses``), never a member a backend merely
   lost a connection to: that one may be alive and call shrink_group.
   Before it posts, a survivor shrinking the default group (it knows a lost member)
   revokes its other groups and tells every other process through the member watch
   (``_world._World.begin_default_shrink`` / ``peer_notice``): a survivor blocked in a
   healthy group on a member now here would otherwise never come to the agreement.
3. **Rebuild**: the new group holds the survivors, renumbered in order, in a store
   namespace of its own. Shrinking the default group makes the result the new default
   (global ranks renumbered) and destroys every other group, as torch does. The old
   group is destroyed (``SHRINK_ABORT``: aborted first, before the agreement).
4. **Again**: a member of the new group already known lost (it died during the
   agreement) makes the new group revoked at birth; it is shrunk the same way at
   once, as a survivor that learned of it later does by calling ``shrink_group`` on
   the group it got.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from ._errors import DistBackendError, DistError, DistNetworkError, DistStoreError, DistTimeoutError
from ._group import ProcessGroup
from ._registry import get_backend_spec
from ._world import _world, resolve_group
from .store import PrefixStore

__all__ = ["shrink_group", "get_failed_ranks", "SHRINK_DEFAULT", "SHRINK_ABORT", "check_request", "agree_exclusion",
           "watched_lost", "note_excluded", "check_backends"]

log = logging.getLogger("ndist.runtime.shrink")

SHRINK_DEFAULT = 0x00  # torch's values
SHRINK_ABORT = 0x01
_POLL_S = 0.01
_SHRINKABLE = {"socket"}  # backends that rebuild from the group's store alone


def get_failed_ranks(group: Any = None) -> list[int]:
    """The ranks (in ``group``) of the members it knows are lost, sorted; ``[]`` while
    it is healthy."""
    return resolve_group(group).failed_ranks()


def _check_exclusion(ranks_to_exclude: Any, pg: ProcessGroup) -> set[int] | None:
    if ranks_to_exclude is None:
        return None
    if isinstance(ranks_to_exclude, (str, bytes)) or not hasattr(ranks_to_exclude, "__iter__"):
        raise TypeError(f"ranks_to_exclude: expected a list of int (group ranks) or None, got "
                        f"{type(ranks_to_exclude).__name__}")
    n, me = pg.size(), pg.rank()
    seen: set[int] = set()
    for i, r in enumerate(ranks_to_exclude):
        if not isinstance(r, int) or isinstance(r, bool):
            raise TypeError(f"ranks_to_exclude: expected int group ranks, got {type(r).__name__} {r!r} at index {i}")
        if not 0 <= r < n:
            raise ValueError(f"ranks_to_exclude: expected group ranks in [0, {n}) of group {pg.group_name!r}, "
                             f"got {r} at index {i}")
        if r in seen:
            raise ValueError(f"ranks_to_exclude: expected distinct ranks, got {r} twice in {list(ranks_to_exclude)}")
        seen.add(r)
    if not seen:
        raise ValueError("ranks_to_exclude: expected at least one rank (or None: the ranks the group lost), got []")
    if len(seen) >= n:
        raise ValueError(f"ranks_to_exclude: expected to keep at least one rank of the {n} of group "
                         f"{pg.group_name!r}, got all of them: {sorted(seen)}")
    if me in seen:
        raise ValueError(f"ranks_to_exclude: expected the ranks of other members, got this rank ({me}) in "
                         f"{sorted(seen)}; an excluded rank does not call shrink_group")
    return seen


def _check_flags(shrink_flags: Any) -> int:
    if not isinstance(shrink_flags, int) or isinstance(shrink_flags, bool):
        raise TypeError(f"shrink_flags: expected int (SHRINK_DEFAULT or SHRINK_ABORT), got "
                        f"{type(shrink_flags).__name__}")
    if shrink_flags not in (SHRINK_DEFAULT, SHRINK_ABORT):
        raise ValueError(f"shrink_flags: expected SHRINK_DEFAULT ({SHRINK_DEFAULT}) or SHRINK_ABORT "
                         f"({SHRINK_ABORT}), got {shrink_flags}")
    return shrink_flags


def check_backends(pg: ProcessGroup, what: str = "shrink_group") -> None:
    """``DistBackendError`` unless every backend of ``pg`` can be rebuilt from the group's
    store alone (``what``: shrink_group, or grow_group, which rebuilds the same way)."""
    names = set(pg.backend_names.values())
    unsupported = sorted(names - _SHRINKABLE)
    if not unsupported:
        return
    # each backend says why, found at run time (mpi: what this MPI lacks for ULFM)
    why = [get_backend_spec(b).why_no_shrink() for b in unsupported]
    raise DistBackendError(f"{what}: group {pg.group_name!r} uses backend(s) {unsupported}, which cannot "
                           f"{what.split('_')[0]}: " + "; ".join(why))


def shrink_group(ranks_to_exclude: Any = None, group: Any = None, shrink_flags: int = SHRINK_DEFAULT,
                 pg_options: Any = None) -> ProcessGroup:
    """A new group of ``group``'s members less ``ranks_to_exclude`` (group ranks; None:
    the members the survivors agree are lost), renumbered in order. Called by every
    survivor. Shrinking the default group makes the result the new default group and
    destroys the other groups (as torch). Returns the new group."""
    pg = resolve_group(group)
    wanted, flags = check_request(pg, ranks_to_exclude, shrink_flags)
    while True:
        count, decided = agree_exclusion(pg, wanted, flags)
        new = _rebuild(pg, count, decided, pg_options)
        if not new.revoked:
            return new
        log.info("group %r: a member of the shrunk group %r was lost during the agreement; shrinking it again",
                 pg.group_name, new.group_name)
        pg, wanted = new, None


def check_request(pg: ProcessGroup, ranks_to_exclude: Any, shrink_flags: Any) -> tuple[set[int] | None, int]:
    """Step 1 on group ``pg``, before any message: the ranks asked for (None: the agreed
    lost ones) and the flags; ``ValueError`` / ``TypeError`` / ``DistBackendError``."""
    pg.require_member("shrink_group")
    if pg.size() <= 1:
        raise ValueError(f"group: expected a group of at least 2 ranks to shrink, got {pg.group_name!r} of size "
                         f"{pg.size()}")
    wanted = _check_exclusion(ranks_to_exclude, pg)
    flags = _check_flags(shrink_flags)
    check_backends(pg)
    return wanted, flags


def agree_exclusion(pg: ProcessGroup, wanted: set[int] | None, flags: int) -> tuple[int, set[int]]:
    """Step 2 on group ``pg`` (aborted first for ``SHRINK_ABORT``): ``(count, excluded)``,
    this shrink's number on ``pg`` (the same on every survivor: it names the new group's
    store namespace) and the group ranks the survivors agreed to exclude."""
    with _world.lock:
        count = getattr(pg, "_shrink_calls", 0) + 1
        pg._shrink_calls = count  # every survivor shrinks a group in the same order
    # a survivor blocked in another group on this one must not wait for it (step 2a)
    _world.begin_default_shrink(pg)
    if flags == SHRINK_ABORT:
        pg._shutdown(abort=True)
    return count, _agree(pg, count, wanted)


def _agree(pg: ProcessGroup, count: int, wanted: set[int] | None) -> set[int]:
    store = PrefixStore(f"shrink/{count}", pg.store)
    me, n = pg.rank(), pg.size()
    mine = set(wanted or ()) | watched_lost(pg)
    known_lost = watched_lost(pg)  # lost for sure: by this process's member watch or another survivor's
    posted: tuple | None = None
    heard: dict[int, set[int]] = {}
    deadline = time.monotonic() + pg.timeout.total_seconds()
    try:
        while True:
            decision = store.get("decision") if store.check(["decision"]) else None
            if decision is not None:
                return _adopt(pg, json.loads(decision), me)
            watched = watched_lost(pg)
            mine |= watched
            known_lost |= watched
            if (mine, known_lost) != posted:
                store.set(f"seen/{me}", json.dumps({"exclude": sorted(mine), "lost": sorted(known_lost)}))
                posted = (set(mine), set(known_lost))
            for r in range(n):
                if r != me and r not in heard and store.check([f"seen/{r}"]):
                    heard[r] = set()
                if r in heard:
                    post = json.loads(store.get(f"seen/{r}"))
                    heard[r] = set(post["exclude"])
                    known_lost |= set(post["lost"])  # (a survivor whose watch saw it go first)
            outside = [r for r in range(n) if r != me and r not in mine]
            union = set(mine).union(*(heard[r] for r in heard if r not in mine)) if heard else set(mine)
            if union != mine:
                mine = union  # learned from another survivor; re-posted on the next pass
                continue
            # (a lost rank may have posted before it went; it is lost when any survivor knows
            # it is, not only when this rank's own watch has told it yet)
            lost = known_lost | watched_lost(pg)
            # this rank too: it is alive and calls shrink_group, if another survivor's set holds it
            alive_excluded = sorted(r for r in mine if (r in heard or r == me) and r not in lost)
            # an excluded rank not known lost is alive: wait until it is gone (an excluded
            # rank ends its process, as in torch) or calls shrink_group too (refused), or the
            # deadline passes (a hung rank: excluded)
            undecided = [r for r in mine if r not in lost and r not in heard]
            if alive_excluded or (all(r in heard for r in outside)
                                  and (not undecided or time.monotonic() >= deadline)):
                proposal = ({"refused": alive_excluded} if alive_excluded else {"exclude": sorted(mine)})
                if not mine and not alive_excluded:
                    proposal = {"empty": True}
                got = store.compare_set("decision", "", json.dumps(proposal))
                return _adopt(pg, json.loads(got), me)
            if time.monotonic() >= deadline:
                missing = [pg.ranks[r] for r in outside if r not in heard]
                raise DistTimeoutError(
                    f"shrink_group on group {pg.group_name!r}: ranks (global) {missing} neither called shrink_group "
                    f"nor were found lost within {pg.timeout.total_seconds():g} s")
            time.sleep(_POLL_S)
    except (DistNetworkError, DistStoreError) as err:
        if isinstance(err, DistError) and "shrink_group" in str(err):
            raise
        raise DistStoreError(
            f"shrink_group on group {pg.group_name!r}: the job's store failed ({err}); the survivors agree through "
            "it, so it must outlive the lost ranks: run under ndistrun (its agent hosts the store) or give "
            "init_process_group a store that no rank hosts") from err


def watched_lost(pg: ProcessGroup) -> set[int]:
    """The group ranks of ``pg``'s members whose process the member watch saw go (died,
    exited, left: ``_World.lost``, or for a torch group its own watch's record,
    ``ProcessGroup.watched_losses``). Not the group's own record: a backend that lost a
    connection records the member as lost too (``lost``), and that member may be alive
    and call shrink_group (its watch then tells nothing); the survivors must keep it.
    A group no member watch covers (neither one of ``init_process_group``'s groups nor a
    torch group the torch watch registered) has only its own record."""
    index = {g: r for r, g in enumerate(pg.ranks)}
    if pg.watched_losses is not None:
        return {index[g] for g in pg.watched_losses() if g in index}
    if _world.watch is None or _world.groups.get(pg.group_name) is not pg:
        return set(pg.failed_ranks())
    return {index[g] for g in list(_world.lost) if g in index}


def note_excluded(pg: ProcessGroup, excluded: set[int]) -> None:
    """The members (group ranks) the survivors agreed to exclude are lost to ``pg``, which
    the shrink then closes: what is pending on them (a queued send, a receive) fails at
    once, naming them, instead of holding the close up for the group timeout. ``pg``'s
    own record may not hold them yet: this rank's member watch may tell it later (a
    survivor released into the shrink by another group, or asked to exclude them), while
    another survivor's watch saw them go (continue kill trial seed 60174). Each is
    recorded as the member watch tells it where it has (host, cause), else as ``lost``."""
    known = dict(pg.watched_losses()) if pg.watched_losses is not None else dict(_world.lost)  # (no lock: a copy)
    for r in sorted(excluded):
        g = pg.ranks[r]
        host, cause, detail = known.get(g) or (_host_of(g), "lost", "excluded by shrink_group: the survivors "
                                               "agreed it is lost")
        pg.note_loss(g, host, cause, detail)  # (nothing if it holds it already)


def _host_of(global_rank: int) -> str:
    """The host of ``global_rank`` as the member watch knows it ("?" without one)."""
    watch, ranks = _world.watch, _world.job_ranks
    if watch is None or not 0 <= global_rank < len(ranks):
        return "?"
    return watch.host_of(ranks[global_rank])


def _adopt(pg: ProcessGroup, decision: dict, me: int) -> set[int]:
    if "refused" in decision:
        alive = decision["refused"]
        raise ValueError(f"ranks_to_exclude: expected ranks that are lost, got ranks {alive} of group "
                         f"{pg.group_name!r}, which are alive and called shrink_group; nothing changed")
    if decision.get("empty"):
        raise ValueError(f"ranks_to_exclude: None means the ranks the group lost, and group {pg.group_name!r} "
                         "has lost none; nothing changed")
    excluded = set(decision["exclude"])
    if me in excluded:
        raise ValueError(f"shrink_group: this rank ({me}) of group {pg.group_name!r} is alive and called "
                         f"shrink_group, but the other survivors excluded it (ranks {sorted(excluded)}); it is not a "
                         "member of the shrunk group")
    return excluded


def _rebuild(pg: ProcessGroup, count: int, excluded: set[int], pg_options: Any) -> ProcessGroup:
    keep = [r for r in range(pg.size()) if r not in excluded]
    kept_global = [pg.ranks[r] for r in keep]
    name = f"{pg.group_name}:shrink{count}"
    options = pg_options if pg_options is not None else pg.options
    pg.note_kept(kept_global)  # (a member a connection failure made this rank think lost)
    note_excluded(pg, excluded)
    with _world.lock:
        if pg is _world.default:
            others = [g for g in _world.groups.values() if g is not pg]
            for other in others:
                other._shutdown(abort=True)
            pg._shutdown()
            me = kept_global.index(pg.ranks[pg.rank()])
            with _world.numbering_lock:  # (the watch's thread tells a loss in one numbering)
                _world.job_ranks = tuple(_world.job_ranks[g] for g in kept_global)
                _world.lost = {kept_global.index(g): v for g, v in _world.lost.items() if g in kept_global}
                _world.numbering = f"{_world.numbering}s{count}"
                _world.shrinking = {}  # (notices of the old numbering)
                new = ProcessGroup(tuple(range(len(keep))), me, name, PrefixStore(name, _world.job_store),
                                   pg.backend_names, pg.timeout, options)
                new.numbering = _world.numbering
                _world.default = new
                _world.groups = {name: new}
        else:
            pg._shutdown()
            _world.groups.pop(pg.group_name, None)
            new = ProcessGroup(tuple(kept_global), pg._global_rank, name, PrefixStore(name, _world.job_store),
                               pg.backend_names, pg.timeout, options)
            new.numbering = pg.numbering
            _world.groups[name] = new
        new.device_id = pg.device_id
        new.group_desc = f"{pg.group_desc or pg.group_name}:shrunk"
        lost = dict(_world.lost)
    for grank, (host, cause, detail) in lost.items():  # lost during the agreement: revoked at birth
        new.note_loss(grank, host, cause, detail)
    log.info("group %r shrunk to %r: excluded ranks %s; this rank is %d of %d", pg.group_name, name,
             sorted(excluded), new.rank(), new.size())
    return new
