"""The process-group API of ``torch.distributed``: init, groups, queries, destroy.

All state lives in one small ``_World`` object (the default group, the
registry of groups, the rendezvous), not in module globals spread over a
large file.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Sequence

from . import _env, _log, _net
from ._device import announce_local_rank, parse_device_id
from ._ended import JOIN_NAMESPACE, job_namespace
from ._errors import EXITED, LEFT
from ._group import ProcessGroup, parse_backend, require_available
from ._heal import await_admission, await_ready, heal_store, listeners_alive, newcomer_rank, ready, register
from ._registry import get_backend_spec, is_registered
from ._rendezvous import Rendezvous, join, rendezvous
from ._timeout import check_timeout
from .store import HashStore, PrefixStore, Store

if TYPE_CHECKING:
    from ._watch import MemberWatch

__all__ = [
    "init_process_group",
    "destroy_process_group",
    "is_initialized",
    "is_available",
    "get_rank",
    "get_world_size",
    "get_backend",
    "new_group",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "get_group_rank",
    "get_global_rank",
    "get_process_group_ranks",
    "joined_running_job",
    "resolve_group",
    "group",
    "GroupMember",
    "default_pg_timeout",
]

log = logging.getLogger("ndist.runtime.group")

default_pg_timeout = timedelta(minutes=30)
_NOT_INIT = "Default process group has not been initialized, please make sure to call init_process_group."
_DESTROY_GRACE = 30.0  # seconds rank 0 keeps its store up for peers still using it


class _World:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.default: ProcessGroup | None = None
        self.groups: dict[str, ProcessGroup] = {}
        self.group_count = 0
        self.init_count = 0
        self.rdzv: Rendezvous | None = None
        self.job_store: Store | None = None  # this init's namespace of the shared store
        self.watch: MemberWatch | None = None  # every other process of the job, watched (``_watch``)
        #: global rank (the default group's numbering) -> rank at init_process_group ("job rank");
        #: the identity only changes when the default group is shrunk
        self.job_ranks: tuple[int, ...] = ()
        #: the processes known lost, by global rank: (host, cause, detail); a group made
        #: later with one of them as a member is revoked from the start
        self.lost: dict[int, tuple[str, str, str]] = {}
        self.numbering = ""  # changes with every shrink of the default group (``BackendContext.numbering``)
        #: the ``shrink`` notices of this numbering (``peer_notice``): sender's global rank ->
        #: (the lost global rank it names, host, cause, detail, why); a group made later with
        #: the sender as a member is revoked from the start (``revoke_told``): the sender is in
        #: shrink_group, which destroys every other group, and will never join it
        self.shrinking: dict[int, tuple[int, str, str, str, str]] = {}
        #: held while ``job_ranks``, ``lost`` and ``groups`` change numbering (a shrink of the
        #: default group), and while the watch's thread reads them (``member_lost``); nothing
        #: that waits is done under it (``lock`` is held across group shutdowns, which may wait
        #: on peers, and the watch must not wait for those)
        self.numbering_lock = threading.Lock()
        # ------------------------------------------------ a heal (``_heal``, ``_grow``)
        #: the heal's namespace of the job's store (None: this init cannot heal: not the
        #: launcher attempt's first init_process_group, or a one-rank job)
        self.heal: Store | None = None
        self.base_size = 0  # the job's world size at its first init_process_group (newcomers' ranks above it)
        self.grows = 0  # grow decisions of the job so far (``grow/<g>``), the same on every member
        self.admitted = 0  # newcomers of the heal's queue that a grow admitted so far
        self.joined = False  # this process joined a running job (``joined_running_job``)

    def member_lost(self, job_rank: int, host: str, cause: str, detail: str) -> None:
        """The watch lost the process that was rank ``job_rank`` at init (its thread):
        every group with it as a member is told (``ProcessGroup.note_loss``)."""
        with self.numbering_lock:  # one numbering: a shrink of the default group renumbers all three
            try:
                grank = self.job_ranks.index(job_rank)
            except ValueError:  # excluded by a shrink already
                return
            self.lost.setdefault(grank, (host, cause, detail))
            groups = list(self.groups.values())
        for pg in groups:
            pg.note_loss(grank, host, cause, detail)

    # ------------------------------------------------ a shrink of the default group begins
    # A survivor blocked in a healthy group (one no lost rank is a member of) waits on a
    # member that went into shrink_group on the default group instead: that member will
    # never join the op (the shrink destroys every other group, as torch's does), and the
    # shrink cannot agree without the blocked survivor. So a survivor that begins that
    # shrink revokes its other groups first and tells every other process (the member
    # watch), whose groups with it as a member are revoked too: the blocked op fails at
    # once with a DistRankFailureError naming the lost rank, and its caller shrinks too.
    def begin_default_shrink(self, pg: ProcessGroup) -> None:
        """Called by a survivor that begins ``shrink_group`` on the default group ``pg``,
        after the argument checks. When any group of this process knows a lost member
        (``ProcessGroup.known_losses``: the default group's own record may not hold it yet,
        a subgroup learnt it first), every other group of this process is revoked for that
        loss (``revoke_for``), and every other process is told (``peer_notice`` there).

        A loss the member watch saw (``lost``) is taken into ``pg``'s own record first (the
        watch's thread may be telling the groups still). A loss only a backend found (a
        connection failed: the member may be alive and call shrink_group) is told as the
        reason the groups are aborted, never recorded as lost anywhere: the agreement
        counts only the watch's losses (``_shrink.watched_lost``)."""
        if pg is not self.default:
            return
        # (no lock: a copy of the dict is one step; the watch's thread adds to it under
        # ``numbering_lock``, and a shrink of the default group, the only renumbering, is this one)
        for g, (host, cause, detail) in dict(self.lost).items():
            pg.note_loss(g, host, cause, detail)  # (nothing if it holds it already)
        losses = pg.known_losses()
        for other in list(self.groups.values()):
            if other is not pg and other.is_member:
                for g, how in other.known_losses().items():
                    losses.setdefault(g, how)
        losses = {g: how for g, how in losses.items() if g in pg.ranks}
        if not losses:
            return
        died = [g for g, (_h, cause, _d) in losses.items() if cause not in (EXITED, LEFT)]
        root = (died or list(losses))[0]
        host, cause, detail = losses[root]
        me = pg.ranks[pg.rank()]
        watch = self.watch
        if watch is not None:  # first: a peer then usually learns it from here, with the host
            watch.tell({"kind": "shrink", "numbering": self.numbering,
                        "lost": [[self.job_ranks[g], h, c, d] for g, (h, c, d) in losses.items()
                                 if g < len(self.job_ranks)]})
        why = f"this rank ({me}) began shrink_group on the default group, which destroys this group"
        for other in list(self.groups.values()):
            if other is not pg and other.is_member:
                other.revoke_for(root, host, cause, detail, why)

    def peer_notice(self, job_rank: int, notice: dict) -> None:
        """A notice from the process that was rank ``job_rank`` at init (the watch
        thread). ``shrink``: it began ``shrink_group`` on the default group; this
        process's groups with it as a member, of the same numbering (not a group made
        after a shrink this notice predates), are revoked for the loss it names."""
        if notice.get("kind") != "shrink" or notice.get("numbering") != self.numbering:
            return
        ranks = self.job_ranks
        try:
            sender = ranks.index(job_rank)
            lost = [(ranks.index(j), str(h), str(c), str(d)) for j, h, c, d in notice.get("lost", ()) if j in ranks]
        except (ValueError, TypeError):
            return
        if not lost:
            return
        died = [x for x in lost if x[2] not in (EXITED, LEFT)]
        grank, host, cause, detail = (died or lost)[0]
        host_of = self.watch.host_of(job_rank) if self.watch is not None else "?"
        why = f"rank {sender} ({host_of}) began shrink_group on the default group, which destroys this group"
        with self.numbering_lock:  # (a shrink here renumbers and empties it under this lock)
            if notice["numbering"] != self.numbering:
                return
            self.shrinking.setdefault(sender, (grank, host, cause, detail, why))
            groups = list(self.groups.values())
        for pg in groups:
            if pg is not self.default and pg.is_member and pg.numbering == notice["numbering"] and sender in pg.ranks:
                pg.revoke_for(grank, host, cause, detail, why)

    def revoke_told(self, pg: ProcessGroup) -> None:
        """``pg`` was just made (not the default group): revoke it from the start if a
        member told this process it began shrink_group on the default group, in this
        numbering (``shrinking``). Seen in kill trial seed 100118: that notice came before
        ``new_group`` here, and the new group's first op waited the group timeout for the
        address of a member that was in the shrink."""
        if pg is self.default or not pg.is_member:
            return
        with self.numbering_lock:
            told = [v for s, v in self.shrinking.items() if s in pg.ranks] if pg.numbering == self.numbering else []
        if told:
            pg.revoke_for(*told[0])

    def await_loss(self, global_rank: int, grace: float, timeout: float) -> bool:
        """An operation lost its connection to ``global_rank``: True once the member watch
        has told every group how it went (``MemberWatch.await_loss``: at once, or within
        ``timeout`` s when its watch connection has ended; False while it is alive)."""
        watch, ranks = self.watch, self.job_ranks  # (no lock: a thread that holds it may wait on this one)
        if watch is None or not 0 <= global_rank < len(ranks):
            return False
        return watch.await_loss(ranks[global_rank], grace, timeout)


_world = _World()
#: this process's group state, for the layers above: read ``world.default`` (the default
#: group, or None) on a hot path instead of calling ``resolve_group(None)``; never write it
world = _world


class _WorldGroup:
    """``group.WORLD``: stands for the default group, whichever it is now."""

    def __getattr__(self, name: str) -> Any:
        return getattr(resolve_group(None), name)

    def __repr__(self) -> str:
        return "group.WORLD"


class group:  # noqa: N801 - torch's name
    WORLD = _WorldGroup()


class GroupMember:
    WORLD = group.WORLD
    NON_GROUP_MEMBER = object()  # torch's sentinel; ndist returns a group with rank() == -1 instead


def resolve_group(grp: Any = None) -> ProcessGroup:
    """``None`` / ``group.WORLD`` / a ProcessGroup -> the ProcessGroup.

    ValueError when ndist is not initialised or the group was destroyed.
    """
    if grp is None or grp is group.WORLD:
        pg = _world.default
        if pg is None:
            raise ValueError(_NOT_INIT)
        return pg
    if isinstance(grp, ProcessGroup):
        grp.require_alive()
        return grp
    raise TypeError(f"group: expected a ProcessGroup, group.WORLD or None, got {type(grp).__name__}")


# ------------------------------------------------------------------ helpers
def _check_int(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name}: expected int, got {type(value).__name__}")
    return value


def _available(name: str) -> bool:
    try:
        return is_registered(name) and get_backend_spec(name).available()
    except Exception:  # noqa: BLE001
        return False


def _default_backends(use_mpi: bool) -> dict[str, str]:
    """backend=None: mpi under an MPI launcher without MASTER_ADDR, else cpu:socket
    (+ cuda:nccl where NCCL is available)."""
    cpu = "mpi" if use_mpi and _available("mpi") else "socket"
    mapping = parse_backend(cpu)  # ValueError listing the registered backends
    if _available("nccl"):
        mapping["cuda"] = "nccl"
    return mapping


def _world_size() -> int:
    return resolve_group(None).size()


# --------------------------------------------------------------------- init
def init_process_group(
    backend: str | None = None,
    init_method: str | None = None,
    timeout: timedelta | None = None,
    world_size: int = -1,
    rank: int = -1,
    store: Store | None = None,
    group_name: str = "",
    pg_options: Any = None,
    device_id: Any = None,
) -> None:
    """Join the job and create the default process group (``torch.distributed.init_process_group``)."""
    with _world.lock:
        if _world.default is not None:
            raise RuntimeError("trying to initialize the default process group twice!")
        timeout = check_timeout(timeout, default_pg_timeout)
        world_size, rank = _check_int("world_size", world_size), _check_int("rank", rank)
        if not isinstance(group_name, str):
            raise TypeError(f"group_name: expected str, got {type(group_name).__name__}")
        if store is not None and init_method is not None:
            raise ValueError("init_method: cannot specify both init_method and store")
        bound = parse_device_id(device_id)
        env = _env.detect()
        _log.configure_from_env(rank if rank >= 0 else env.rank)
        if store is not None:
            if not isinstance(store, Store):
                raise TypeError(f"store: expected an ndist Store, got {type(store).__name__}")
            if world_size <= 0:
                raise ValueError(f"world_size: expected a positive int when a store is given, got {world_size}")
            if not 0 <= rank < world_size:
                raise ValueError(f"rank: expected 0 <= rank < world_size ({world_size}) when a store is given, got {rank}")
        use_mpi = (
            store is None
            and init_method in (None, "env://")
            and env.source in ("mpi", "slurm")
            and "MASTER_ADDR" not in os.environ
            and env.agent_store is None
        )
        backends = _default_backends(use_mpi) if backend is None else parse_backend(backend)
        require_available(backends, "init_process_group")  # DistBackendError: what to install
        joining = (env.replaces is not None and store is None and init_method in (None, "env://")
                   and env.agent_store is not None and rank in (-1, env.rank) and world_size in (-1, env.world_size))

        singleton = (
            store is None
            and init_method is None
            and env.source is None
            and env.master_addr is None
            and env.agent_store is None
            and world_size in (-1, 1)
            and rank in (-1, 0)
            and set(backends.values()) == {"mpi"}
        )
        if store is not None:
            rdzv = Rendezvous(store, rank, world_size, owned=[], via="store")
        elif singleton:
            # init_process_group("mpi") outside any launcher: a one-rank MPI job (MPI's
            # singleton init), as torch does; no other process to meet, so no TCP store.
            rdzv = Rendezvous(HashStore(), 0, 1, owned=[], via="mpi singleton")
        else:
            rdzv = rendezvous(init_method or "env://", rank, world_size, timeout, env)
        if joining:
            _join_running_job(rdzv, env, timeout, backends, pg_options, bound)
            return
        watch = None
        try:
            job_store = PrefixStore(job_namespace(env.restart_count, _world.init_count), rdzv.store)
            if rdzv.world_size > 1:  # every member watched from here on, before any data link (``_watch``)
                # loaded here: `import ndist.distributed` does not pay for the watch until a job starts
                from ._watch import MemberWatch  # noqa: PLC0415 - import cost, not a cycle

                watch = MemberWatch(PrefixStore("watch", job_store), rdzv.rank, rdzv.world_size, _net.job_secret(),
                                    timeout.total_seconds(), _world.member_lost, _world.peer_notice)
                watch.publish()
            join(PrefixStore(JOIN_NAMESPACE, job_store), rdzv.rank, rdzv.world_size, timeout)
        except BaseException:
            if watch is not None:
                watch.close(LEFT, "init_process_group failed")
            rdzv.close()
            raise
        _world.init_count += 1
        _world.rdzv, _world.job_store = rdzv, job_store
        _world.job_ranks, _world.lost, _world.numbering = tuple(range(rdzv.world_size)), {}, ""
        _world.shrinking = {}
        _world.watch = watch
        first = _world.init_count == 1  # (the launcher attempt's first init: newcomers join its namespace)
        _world.heal = heal_store(job_store) if first and watch is not None and env.agent_store is not None else None
        _world.base_size, _world.grows, _world.admitted, _world.joined = rdzv.world_size, 0, 0, False
        name = group_name or "0"
        pg = ProcessGroup(
            tuple(range(rdzv.world_size)), rdzv.rank, name, PrefixStore(name, job_store), backends, timeout, pg_options
        )
        pg.device_id = bound  # the CUDA backend's device (docs/gpu.md, runtime/_device.py)
        announce_local_rank(env.local_rank)  # 'cuda' on a launched rank: LOCAL_RANK % device_count()
        _world.default = pg
        _world.groups = {name: pg}
        _world.group_count = 1
        if watch is not None:
            watch.start()
        log.info("rank %d of %d initialised (%s rendezvous, backend %r)", rdzv.rank, rdzv.world_size, rdzv.via, pg.backend_name())


def _join_running_job(rdzv: Rendezvous, env: _env.JobEnv, timeout: timedelta, backends: dict[str, str],
                      pg_options: Any, bound: Any) -> None:
    """``init_process_group`` in a process started in a lost rank's place (``NDIST_REPLACES``):
    queue in the heal (``_heal``), wait until a ``grow_group`` of the survivors admits it,
    then take its place in the grown default group (its rank and numbering, as the decision
    says), watch every member, and wait until every member is ready. A member lost while
    it waits leaves the group revoked (the survivors' ``grow_group`` raises; every member
    then shrinks): this returns all the same, and the group's first operation raises."""
    from ._watch import MemberWatch  # noqa: PLC0415 - import cost, not a cycle (as in init_process_group)

    first = PrefixStore(job_namespace(env.restart_count, 0), rdzv.store)
    heal = heal_store(first)
    seconds = timeout.total_seconds()
    watch = MemberWatch(PrefixStore("watch", first), -1, rdzv.world_size, _net.job_secret(), seconds,
                        _world.member_lost, _world.peer_notice)
    try:
        token = register(heal, env.replaces, env.replacement, watch.info)
        log.info("rank slot %d (replacement %d): waiting to be admitted by the survivors' grow_group",
                 env.replaces, env.replacement)
        g, decision = await_admission(heal, token, timeout,
                                      lambda: listeners_alive(watch.store, rdzv.world_size, heal))
        place = decision["queue_from"] + decision["joiners"].index(token)
        world = int(decision["world"])
        me_job, members = newcomer_rank(world, place), [int(r) for r in decision["members"]]
        watch.rank = me_job
        this_grow = {newcomer_rank(world, decision["queue_from"] + i): info for i, info in enumerate(decision["infos"])}
        earlier = [r for r in members if r != me_job and r not in this_grow]
        peers = dict(zip(earlier, (json.loads(v) for v in watch.store.multi_get([f"addr/{r}" for r in earlier]))))
        peers.update(this_grow)
        watch.store.set(f"addr/{me_job}", json.dumps(watch.info))  # (for the newcomers of later grows)
    except BaseException:
        watch.close(LEFT, "init_process_group failed")
        rdzv.close()
        raise
    me, name = members.index(me_job), str(decision["name"])
    _world.init_count += 1
    _world.rdzv, _world.job_store = rdzv, first
    with _world.numbering_lock:
        _world.job_ranks, _world.lost, _world.numbering = tuple(members), {}, str(decision["numbering"])
        _world.shrinking = {}
    _world.watch = watch
    _world.heal, _world.base_size, _world.grows = heal, world, g + 1
    _world.admitted = int(decision["queue_from"]) + len(decision["joiners"])
    _world.joined = True
    pg = ProcessGroup(tuple(range(len(members))), me, name, PrefixStore(name, first), backends, timeout, pg_options)
    pg.device_id = bound
    pg.numbering = _world.numbering
    pg.group_desc = f"{name}:joined"
    announce_local_rank(env.local_rank)
    _world.default, _world.groups = pg, {name: pg}
    _world.group_count = int(decision["group_count"])
    watch.start(peers)
    ready(heal, g, me)
    gone = await_ready(heal, g, len(members), lambda: dict(_world.lost), seconds,
                       f"init_process_group on the newcomer rank {me} (replacing rank {env.replaces})")
    log.info("rank slot %d (replacement %d) joined the running job as rank %d of %d%s", env.replaces,
             env.replacement, me, len(members), f"; members lost meanwhile: {sorted(gone)}" if gone else "")


def joined_running_job() -> bool:
    """True in a process whose ``init_process_group`` joined a running job: it was started in
    a lost rank's place (``ndistrun --on-failure replace``) and admitted by the survivors'
    ``grow_group``; it must receive the job's state (weights, step) from them. False in the
    job's first processes and before ``init_process_group``."""
    return _world.joined and _world.default is not None


def destroy_process_group(group: Any = None) -> None:
    """Close ``group``'s backends (all groups and the store when ``group`` is None /
    WORLD). Never waits on a dead peer."""
    with _world.lock:
        pg = resolve_group(group)
        if pg is not _world.default:
            pg._shutdown()
            _world.groups.pop(pg.group_name, None)
            return
        for other in list(_world.groups.values()):
            if other is not pg:
                other._shutdown()
        pg._shutdown()
        rdzv, watch = _world.rdzv, _world.watch
        _world.default, _world.groups, _world.rdzv, _world.job_store, _world.watch = None, {}, None, None, None
        _world.heal, _world.joined = None, False
    if watch is not None:  # (outside the lock: its thread may be telling a loss)
        watch.close(LEFT, "it called destroy_process_group")
    if rdzv is not None:
        rdzv.close(grace=min(_DESTROY_GRACE, pg.timeout.total_seconds()))


# ------------------------------------------------------------------- queries
def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return _world.default is not None


def get_rank(group: Any = None) -> int:
    """This process's rank in ``group`` (-1 if it is not a member, as torch)."""
    return resolve_group(group).rank()


def get_world_size(group: Any = None) -> int:
    """The size of ``group`` (-1 on a process that is not a member, as torch)."""
    pg = resolve_group(group)
    return pg.size() if pg.is_member else -1


def get_backend(group: Any = None) -> str:
    return resolve_group(group).backend_name()


def get_group_rank(group: Any, global_rank: int) -> int:
    return resolve_group(group).group_rank(_check_int("global_rank", global_rank))


def get_global_rank(group: Any, group_rank: int) -> int:
    return resolve_group(group).global_rank(_check_int("group_rank", group_rank))


def get_process_group_ranks(group: Any) -> list[int]:
    return list(resolve_group(group).ranks)


# -------------------------------------------------------------------- groups
def new_group(
    ranks: Sequence[int] | None = None,
    timeout: timedelta | None = None,
    backend: str | None = None,
    pg_options: Any = None,
    use_local_synchronization: bool = False,
    group_desc: str | None = None,
) -> ProcessGroup:
    """A group of ``ranks`` (all by default). Every rank must call it, in the same
    order, as in torch; a non-member gets a group whose ``rank()`` is -1."""
    with _world.lock:
        world = resolve_group(None)
        n = world.size()
        if ranks is None:
            members = list(range(n))
        else:
            if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
                raise TypeError(f"ranks: expected a list of int, got {type(ranks).__name__}")
            members = []
            for r in ranks:
                if not isinstance(r, int) or isinstance(r, bool):
                    raise TypeError(f"ranks: expected a list of int, got an element of type {type(r).__name__}")
                if not 0 <= r < n:
                    raise ValueError(f"ranks: expected global ranks in [0, {n}), got {r}")
                members.append(r)
            if len(set(members)) != len(members):
                raise ValueError(f"ranks: expected distinct ranks, got {list(ranks)}")
            if not members:
                raise ValueError("ranks: expected at least one rank, got []")
            members.sort()
        timeout = check_timeout(timeout, world.timeout)
        mapping = world.backend_names if backend is None else parse_backend(backend)
        if backend is not None:
            require_available(mapping, "new_group")
        name = str(_world.group_count)
        _world.group_count += 1
        pg = ProcessGroup(
            tuple(members), world._global_rank, name, PrefixStore(name, _world.job_store), mapping, timeout,
            pg_options if pg_options is not None else world.options,
        )
        pg.group_desc = group_desc or ""
        pg.device_id = world.device_id  # subgroups use the bound device too, as in torch
        pg.numbering = _world.numbering
        _world.groups[name] = pg
        for grank, (host, cause, detail) in list(_world.lost.items()):  # revoked from the start
            pg.note_loss(grank, host, cause, detail)
        _world.revoke_told(pg)
        return pg


def new_subgroups_by_enumeration(
    ranks_per_subgroup_list: Sequence[Sequence[int]],
    timeout: timedelta | None = None,
    backend: str | None = None,
    pg_options: Any = None,
) -> tuple[ProcessGroup | None, list[ProcessGroup]]:
    """One group per list of ranks; returns (the group this rank is in, all groups)."""
    if not ranks_per_subgroup_list:
        raise ValueError("ranks_per_subgroup_list: expected a non-empty list of rank lists, got an empty one")
    seen: set[int] = set()
    for sub in ranks_per_subgroup_list:
        for r in sub:
            if r in seen:
                raise ValueError(f"ranks_per_subgroup_list: rank {r} appears in more than one subgroup")
            seen.add(r)
    mine, groups = None, []
    for sub in ranks_per_subgroup_list:
        pg = new_group(sub, timeout=timeout, backend=backend, pg_options=pg_options)
        groups.append(pg)
        if pg.is_member:
            mine = pg
    return mine, groups


def new_subgroups(
    group_size: int | None = None,
    group: Any = None,
    timeout: timedelta | None = None,
    backend: str | None = None,
    pg_options: Any = None,
    group_desc: str | None = None,
) -> tuple[ProcessGroup, list[ProcessGroup]]:
    """Split the world into consecutive groups of ``group_size`` ranks (default, as
    torch: the number of CUDA devices; ``ValueError`` without CUDA). Returns (this
    rank's subgroup, all subgroups)."""
    n = _world_size()
    if group is not None and resolve_group(group) is not resolve_group(None):
        raise ValueError("group: new_subgroups splits the default group only")
    if group_size is None:
        from ..tensor import _cuda

        if not _cuda.is_available():
            raise ValueError(
                "group_size: not given, and the default (the number of CUDA devices, as in torch) only takes "
                "effect when CUDA is available; pass group_size for CPU subgroups"
            )
        group_size = _cuda.device_count()
    group_size = _check_int("group_size", group_size)
    if group_size <= 0 or group_size > n or n % group_size:
        raise ValueError(f"group_size: expected a positive divisor of the world size {n}, got {group_size}")
    mine, groups = new_subgroups_by_enumeration(
        [list(range(s, s + group_size)) for s in range(0, n, group_size)], timeout, backend, pg_options
    )
    assert mine is not None  # every rank is in exactly one block
    return mine, groups
