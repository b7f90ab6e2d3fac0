"""The member watch of a torch job on backend ``"ndist"``: every process watched from
``torch.distributed.init_process_group`` on.

ndist's own ``init_process_group`` starts a ``MemberWatch`` (``runtime/_watch.py``: a full
mesh of watch connections, one thread) before any data link exists. torch's
``init_process_group("ndist")`` only calls the backend's creator for the default group
(``_backend.create``): the creator starts the same watch there (``start``), through the
group's store (torch's, wrapped: set / get / compare_set / wait), before it returns. Its
default group's ranks at that moment are the processes' *job ranks*, the watch's names.

torch groups number their members differently over time (a shrink of the default group
renumbers torch's global ranks; a shrunk group keeps its parent's numbering), so each ndist
group under a torch group (``ProcessGroupNdist.ndist_group``) is registered here with its
*table*: global rank of its numbering -> job rank (``adopt``, ``adopt_shrunk``). A loss the
watch tells (by job rank) reaches every registered group with that process as a member
(``ProcessGroup.note_loss``), and a group made after a loss is told at birth. The watch's
record, not the group's (which also holds members a backend merely lost a connection to),
is what a registered group's ``shrink_group`` agreement counts as lost
(``ProcessGroup.watched_losses``), as on ndist's own API.

Shrinking the default group (``torch.distributed.shrink_group``, ``_shrink.shrink``), a
survivor that knows a lost member, in any of its groups (the default group's own record may
not hold it yet: a subgroup learnt it first), first revokes its other groups and tells every
process (``begin_default_shrink``; a notice on the watch connections): there, the groups with that
survivor as a member are revoked (``ProcessGroup.revoke_for``), so a survivor blocked in one
on it fails at once and comes to the shrink too, as on ndist's own API
(``runtime/_world.py``, ``_World.begin_default_shrink``).
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from typing import Any

from ..runtime import _net
from ..runtime import ProcessGroup as NdistGroup
from ..runtime._errors import EXITED, LEFT
from ..runtime._watch import MemberWatch
from ..runtime.store import PrefixStore

__all__ = ["start", "close", "adopt", "adopt_shrunk", "default_shrunk", "is_default", "begin_default_shrink",
           "job_ranks_of"]

log = logging.getLogger("ndist.torch.watch")

_NOTICE = "torch-shrink"  # a notice's kind (ndist's own world says "shrink")


class _Job:
    """This process's watch and what maps its job ranks onto the groups."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.watch: MemberWatch | None = None
        #: torch's current global rank -> job rank (rank at init_process_group)
        self.table: tuple[int, ...] = ()
        #: job rank -> (host, cause, detail): the processes the watch lost
        self.lost: dict[int, tuple[str, str, str]] = {}
        #: each registered ndist group -> (its numbering's table, the epoch it was made in)
        self.groups: "weakref.WeakKeyDictionary[NdistGroup, tuple[tuple[int, ...], int]]" = \
            weakref.WeakKeyDictionary()
        self.default: "weakref.ref[NdistGroup] | None" = None
        #: shrinks of the default group so far (a notice names its sender's)
        self.epoch = 0
        #: the shrink notices of this epoch: sender's job rank -> (the lost process it names as
        #: ``[job, host, cause, detail]``, the sender's host); a group registered later with the
        #: sender as a member is revoked at birth (``adopt``), as on ndist's own API
        #: (``_World.revoke_told``)
        self.shrinking: dict[int, tuple[list, str]] = {}


_job = _Job()


def start(store: Any, rank: int, size: int, timeout_s: float) -> None:
    """The default group is being made (``init_process_group``): watch every other
    process of the job from now on (``store``: the group's, an ndist Store)."""
    close(LEFT, "it called init_process_group again")  # (an earlier round's, not destroyed)
    watch = None
    if size > 1:
        watch = MemberWatch(PrefixStore("ndist-watch", store), rank, size, _net.job_secret(), timeout_s,
                            _on_loss, _on_notice)
        try:
            watch.publish()
            watch.start()
        except BaseException:
            watch.close(LEFT, "init_process_group failed")
            raise
    with _job.lock:
        _job.watch, _job.table, _job.lost, _job.epoch = watch, tuple(range(size)), {}, 0
        _job.shrinking = {}
        _job.groups = weakref.WeakKeyDictionary()
        _job.default = None


def close(cause: str = LEFT, detail: str = "it called destroy_process_group") -> None:
    """Stop watching (the default group was destroyed): a goodbye to every peer."""
    with _job.lock:
        watch, _job.watch, _job.default = _job.watch, None, None
    if watch is not None:
        watch.close(cause, detail)


def adopt(nd: NdistGroup, torch_ranks: Any, default: bool = False) -> None:
    """Register ``nd`` (a group made by ``create``; ``torch_ranks``: its members, torch's
    current global ranks); it learns at once of the losses the watch told already."""
    with _job.lock:
        table = _job.table
        if _job.watch is None or any(not 0 <= g < len(table) for g in nd.ranks):
            return  # (no watch: a one-process job, or another round's group)
        _job.groups[nd] = (table, _job.epoch)
        nd.loss_verdict = functools.partial(_await_loss, weakref.ref(nd))
        nd.watched_losses = functools.partial(_watched_losses, weakref.ref(nd))
        if default:
            _job.default = weakref.ref(nd)
        lost = dict(_job.lost)
        told = [] if default else list(_job.shrinking.items())
    _tell_lost(nd, table, lost)
    for job, (root, host_of) in told:  # a member already went into the default group's shrink
        if _revoke_for_notice(nd, table, job, root, host_of):
            break


def adopt_shrunk(nd: NdistGroup, parent: NdistGroup) -> None:
    """Register ``nd``, made by shrinking ``parent`` (it keeps the parent's numbering)."""
    with _job.lock:
        got = _job.groups.get(parent)
        if got is None:
            return
        table = got[0]
        _job.groups[nd] = (table, _job.epoch)
        nd.loss_verdict = functools.partial(_await_loss, weakref.ref(nd))
        nd.watched_losses = functools.partial(_watched_losses, weakref.ref(nd))
        lost = dict(_job.lost)
    _tell_lost(nd, table, lost)


def _await_loss(ref: "weakref.ref[NdistGroup]", global_rank: int, grace: float, timeout: float) -> bool:
    """``ProcessGroup.loss_verdict`` of a registered group: its global rank mapped through
    the group's table onto the job rank the watch knows (``MemberWatch.await_loss``)."""
    nd, watch = ref(), _job.watch
    got = _job.groups.get(nd) if nd is not None else None
    if got is None or watch is None or not 0 <= global_rank < len(got[0]):
        return False
    return watch.await_loss(got[0][global_rank], grace, timeout)


def _watched_losses(ref: "weakref.ref[NdistGroup]") -> dict[int, tuple[str, str, str]]:
    """``ProcessGroup.watched_losses`` of a registered group: its members whose process
    the watch lost (``_job.lost``, by job rank), by global rank of the group's numbering;
    never a member only a connection failure made the group record lost (it may be alive).
    A group no longer registered (another round's) has only its own record."""
    nd = ref()
    if nd is None:
        return {}
    with _job.lock:
        got = _job.groups.get(nd)
        lost = dict(_job.lost)
    if got is None:
        return nd.lost_members()
    table = got[0]
    return {g: lost[table[g]] for g in nd.ranks if 0 <= g < len(table) and table[g] in lost}


def job_ranks_of(nd: NdistGroup) -> list[int] | None:
    """The job ranks of ``nd``'s members, by group rank (None: not registered)."""
    got = _job.groups.get(nd)
    return None if got is None else [got[0][g] for g in nd.ranks]


def is_default(nd: NdistGroup) -> bool:
    ref = _job.default
    return ref is not None and ref() is nd


def default_shrunk(nd: NdistGroup) -> None:
    """``nd`` (registered by ``adopt_shrunk``) is torch's new default group: torch's
    global ranks are now its group ranks."""
    with _job.lock:
        got = _job.groups.get(nd)
        if got is None:
            return
        table = got[0]
        _job.table = tuple(table[g] for g in nd.ranks)
        _job.epoch += 1
        _job.shrinking = {}  # (notices of the old epoch)
        _job.groups[nd] = (table, _job.epoch)
        _job.default = weakref.ref(nd)


def begin_default_shrink(nd: NdistGroup) -> None:
    """A shrink of the default group ``nd`` begins here (after its argument checks).
    When any registered group of this process knows a loss of one of ``nd``'s members
    (``ProcessGroup.known_losses``: ``nd``'s own record may not hold it yet, a subgroup
    learnt it first), every process is told (``_on_notice`` there), and every other group
    of this process is revoked for that loss, as ``_World.begin_default_shrink`` does.

    A loss the watch saw (``_job.lost``) is taken into ``nd``'s own record first (the
    watch's thread may be telling the groups still). A loss only a backend found (a
    connection failed: the member may be alive and call shrink_group) is told as the
    reason the groups are aborted, never recorded as lost anywhere: the agreement counts
    only the watch's losses (``ProcessGroup.watched_losses``)."""
    with _job.lock:
        got = _job.groups.get(nd)
        watch, epoch = _job.watch, _job.epoch
        watched = dict(_job.lost)
        others = [(g, t) for g, (t, _e) in list(_job.groups.items()) if g is not nd]
    if got is None:
        return
    table = got[0]
    _tell_lost(nd, table, watched)  # (nothing for a loss it holds already)
    # every group's known losses, by job rank (each group numbers its members by its own table)
    losses = {table[g]: how for g, how in nd.known_losses().items() if 0 <= g < len(table)}
    for other, other_table in others:
        if other.is_member and not other.destroyed:
            for g, how in other.known_losses().items():
                if 0 <= g < len(other_table):
                    losses.setdefault(other_table[g], how)
    members = {table[g] for g in nd.ranks if 0 <= g < len(table)}
    lost = [[job, h, c, d] for job, (h, c, d) in losses.items() if job in members]
    if not lost:
        return
    if watch is not None:
        watch.tell({"kind": _NOTICE, "epoch": epoch, "lost": lost})
    root = _root(lost)
    me = nd.ranks[nd.rank()]
    why = f"this rank ({me}) began shrink_group on the default group, which destroys this group"
    for other, other_table in others:
        if other.is_member and not other.destroyed and root[0] in other_table:
            other.revoke_for(other_table.index(root[0]), root[1], root[2], root[3], why)


def _root(lost: list) -> list:
    died = [x for x in lost if x[2] not in (EXITED, LEFT)]
    return (died or lost)[0]


def _tell_lost(nd: NdistGroup, table: tuple, lost: dict) -> None:
    for job, (host, cause, detail) in lost.items():
        if job in table:
            nd.note_loss(table.index(job), host, cause, detail)


def _on_loss(job: int, host: str, cause: str, detail: str) -> None:
    """The watch lost the process of job rank ``job`` (its thread)."""
    with _job.lock:
        _job.lost.setdefault(job, (host, cause, detail))
        groups = list(_job.groups.items())
    for nd, (table, _epoch) in groups:
        if job in table:
            nd.note_loss(table.index(job), host, cause, detail)


def _on_notice(job: int, notice: dict) -> None:
    """A notice from the process of job rank ``job`` (the watch's thread): it began a
    shrink of the default group; this process's groups of the same epoch with it as a
    member (not the default group) are revoked for the loss it names."""
    if notice.get("kind") != _NOTICE:
        return
    try:
        lost = [[int(j), str(h), str(c), str(d)] for j, h, c, d in notice.get("lost", ())]
        epoch = int(notice["epoch"])
    except (KeyError, TypeError, ValueError):
        return
    if not lost:
        return
    root = _root(lost)
    with _job.lock:
        groups = list(_job.groups.items())
        default = _job.default() if _job.default is not None else None
        watch = _job.watch
        if epoch == _job.epoch:  # (a group registered later is told at birth: ``adopt``)
            _job.shrinking.setdefault(job, (root, watch.host_of(job) if watch is not None else "?"))
    host_of = watch.host_of(job) if watch is not None else "?"
    for nd, (table, made) in groups:
        if nd is not default and made == epoch:
            _revoke_for_notice(nd, table, job, root, host_of)


def _revoke_for_notice(nd: NdistGroup, table: tuple, job: int, root: list, host_of: str) -> bool:
    """Revoke ``nd`` (numbered by ``table``) for the shrink notice of the process of job rank
    ``job``, naming the loss ``root``, when that process is one of its members; whether it did."""
    if job not in table or root[0] not in table or not nd.is_member:
        return False
    sender = table.index(job)
    if sender not in nd.ranks:
        return False
    nd.revoke_for(table.index(root[0]), root[1], root[2], root[3],
                  f"rank {sender} ({host_of}) began shrink_group on the default group, which destroys this group")
    return True
