"""SocketBackend: the default CPU backend (TCP links opened as needed + shared memory)."""

from __future__ import annotations

import itertools
import logging
import os
import socket
import time

import numpy as np

from ....runtime import BackendContext, DistBackendError, DistError, DistNetworkError, DistTimeoutError, Work
from ....runtime import _net
from ..._backend import DONE, Call, CollectiveBackend, split_views
from .wire import _cma
from .wire import _frame as F
from .failure import _losses
from .failure._group import GroupFailure
from .native import _capi
from .native import _fast
from .native import _engine as _native
from .native import _twolevel
from .failure import _stalls
from .engine._algorithms import CHUNK, Algorithms
from ._pending import Pending
from .wire._links import Links, attach, setup
from .engine._engine import CollectiveStreams, OpInfo, wait_warning_from_env
from ._engines import NATIVE, NATIVE_TCP, NATIVE_TWO, PYTHON, CollectiveEngine, select
from ._executor import Executor
from .p2p._p2p import P2P
from .schedules._reduce import finalize
from .wire import _ring
from .wire._segment import OwnSegment, PeerSegments, job_prefix, sweep_dead, unlink_prefix
from .wire._tcp import Mesh

__all__ = ["SocketBackend", "TRANSPORT_ENV", "SEGMENT_MIN"]

log = logging.getLogger("ndist.collectives.socket")

TRANSPORT_ENV = "NDIST_TRANSPORT"
#: payloads to a same-host peer at least this large go through this rank's shared-memory segment
#: (``NDIST_TRANSPORT=shm``: every non-empty payload).
SEGMENT_MIN = 32 << 10
_instances = itertools.count()



def _transport_mode(options) -> str:
    mode = getattr(options, "transport", None) or os.environ.get(TRANSPORT_ENV, "auto")
    mode = str(mode).lower()
    if mode not in ("auto", "tcp", "shm"):
        raise ValueError(f"{TRANSPORT_ENV}: expected 'tcp', 'shm' or 'auto', got {mode!r}")
    return mode


def _trivial(op: str, blocking: bool, outputs=None) -> Work:
    """A one-rank group's op, already done here: the shared DONE for a blocking call."""
    return DONE if blocking else Work.completed(op, -1, outputs)


def _u8(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


class SocketBackend(CollectiveBackend):
    """Gloo-style backend: TCP links opened as collectives need them (not a full mesh),
    shared-memory payloads between ranks on one host.

    Collectives run in issue order, inline on the caller's thread when it
    will wait and nothing is queued (``blocking=True``), else on one worker
    thread. Point-to-point messages use their own streams and reader thread,
    so they never queue behind, or deadlock with, collectives or each other.
    """

    name = "socket"

    def __init__(self, ctx: BackendContext) -> None:
        super().__init__(ctx)
        if not 0 <= ctx.rank < ctx.size:
            raise ValueError(f"rank: expected 0 <= rank < size={ctx.size}, got {ctx.rank}")
        self._timeout = ctx.timeout.total_seconds()
        #: global rank of each group rank: every message and ``.rank`` names global ranks
        granks = tuple(ctx.global_ranks or ())
        self.granks = granks if len(granks) == ctx.size else tuple(range(ctx.size))
        self.gindex = {g: i for i, g in enumerate(self.granks)}
        #: the group's failure state: the members lost, the first loss, who is told
        #: (``failure/_group``); every part of the backend reports a loss to ``record``
        self.failure = GroupFailure(self._tell_sides, self._tell_groups)
        self._mode = _transport_mode(ctx.options)
        self._links = Links(1 if self._mode == "shm" else SEGMENT_MIN)
        secret = _net.job_secret()
        self._prefix = f"{job_prefix(secret, ctx.group_name)}-r{ctx.rank}-p{os.getpid()}-i{next(_instances)}"
        self._seg = OwnSegment(self._prefix)
        if self._mode != "tcp":
            n = sweep_dead(job_prefix(secret))
            if n:
                log.info("unlinked %d shared-memory segment(s) left by dead processes of this job", n)
        self._peer_segs = PeerSegments()
        # shared-memory rings for the collective streams of same-host pairs (x86-64)
        cap = _ring.capacity_from_env(ctx.size) if self._mode != "tcp" and _ring.available() else 0
        self._rings = None
        if cap and ctx.size > 1:
            try:
                self._rings = _ring.RingFile(_ring.path_for(self._prefix), ctx.size, cap, create=True)
            except OSError as err:  # e.g. /dev/shm full: the sockets carry everything
                log.warning("no shared-memory rings (%s); collectives use the sockets only", err)
        # the native engine (same-host groups): this rank's file now, the group at first use
        self._native_mod = _native.module_for(self._mode, ctx.options) if ctx.size > 1 else None
        self._nfile = None
        if self._native_mod is not None:
            try:
                self._nfile = _native.NativeFile(self._prefix, ctx.size, _native.slot_bytes())
            except OSError as err:  # e.g. /dev/shm full: the Python engine runs everything
                log.warning("no native engine (%s); collectives run on the Python engine", err)
        # the native engine over TCP (groups across hosts): what this rank offers (NDIST_NATIVE_TCP)
        self._tcp_offer = _native.tcp_offer(ctx.options) if ctx.size > 1 else ""
        self._native: _native.NativeAlgorithms | None = None
        #: the engine's C interface handle (``engine_handle``), made on first request
        self._capi: _capi.Handle | None = None
        self._eng: CollectiveStreams | None = None
        #: the engine the collectives run on (``_engines.select``: ``Algorithms`` over the
        #: Python engine, or ``NativeAlgorithms``, which is then ``_native`` too)
        self._alg: CollectiveEngine | None = None
        #: runs the collectives in issue order, and numbers them (``Executor.number`` / ``claim``);
        #: its ``state.closed`` is this backend's ``closed``
        self._exec = Executor(f"socket[{ctx.group_name}:{ctx.rank}]",
                              _native.lane_state(ctx.options) if ctx.size > 1 else None)
        self._p2p_exec = Executor(f"socket-p2p[{ctx.group_name}:{ctx.rank}]")
        self._p2p = P2P(ctx.rank, ctx.size, ctx.group_name, self._timeout, lambda: self._mesh, self._p2p_exec,
                        self.granks, self.failure.record)
        self._p2p.stalls.on_stalled = lambda ranks, final=False: self._stalled(ranks, True, final)  # (its own collectives too)
        self._mesh = Mesh(ctx.store, ctx.rank, ctx.size, ctx.group_name, secret, self._timeout,
                          {"shm": self._prefix, "transport": self._mode, "ncpu": os.cpu_count() or 1,
                           "cma": _cma.probe_info() if self._mode == "auto" else None,
                           "ring": self._rings.capacity if self._rings is not None else 0,
                           "native": self._nfile.slot if self._nfile is not None else 0,
                           "native_tcp": self._tcp_offer},
                          on_p2p=self._p2p.incoming, granks=self.granks,
                          losses=_losses.JobRecord(job_prefix(secret) + ctx.numbering),
                          ring_for=self._rings.reserve if self._rings is not None else None)
        self.job = self._mesh.job
        #: what a Work of this group waits on (``Work.pending``, for its timeout's message)
        self._pending = Pending(self._exec, self._mesh, self._timeout)
        self._mesh.explain_wait = lambda granks: _stalls.explain_wait(self, granks, self._timeout)
        _losses.watch(self)

    # ------------------------------------------------------------ plumbing
    def _engine(self) -> CollectiveStreams:
        """Set the group up on its first collective: the group-wide paths (``Links``), the
        engine (its collective links open as each is first needed) and the algorithms."""
        if self._eng is None:
            if self.failure.first is not None:  # a member was lost before the group connected
                rank, host, message = self.failure.first
                raise DistNetworkError(f"group {self.ctx.group_name!r}: rank {rank} ({host}) is lost; {message}",
                                       rank=rank, host=host)
            peers = [p for p in range(self.size) if p != self.rank]
            setup(self._links, self._mesh, self.rank, self.size, self._mode, CHUNK)
            hosts = {p: self._mesh.host_of(p) for p in peers}
            prefixes = {p: self._mesh.peer(p)["shm"] for p in peers}
            spin = self.size <= (os.cpu_count() or 1)
            # no link opens here: each opens on its first use (``CollectiveStreams.open``)
            eng = CollectiveStreams(self.rank, self.size, self.ctx.group_name, {}, hosts, prefixes, self._peer_segs,
                         self._seg, spin, self.granks, opener=self._open_link,
                         on_link=lambda conn, facts: attach(self._links, eng, conn, facts, self._mesh, self.rank,
                                                            self.size, self._rings, self.ctx.group_name))
            eng.losses.on_loss = self.failure.record
            eng.stalls.on_stalled = self._stalled
            self._alg = Algorithms(eng, self._seg, self._links, self.rank, self.size)
            self._attach_native(peers)
            self._eng = self._pending.eng = eng
            if self._native is not None and self._native.broken is not None:
                raise self._native.broken
            if self.failure.first is not None:  # recorded while connecting
                eng.losses.notify_lost(*self.failure.first)
        return self._eng

    def _open_link(self, peer: int, deadline: float):
        """The engine's ``opener``: the collective link to ``peer``; a failure because it is
        known dead says so (``err.dead``: the engine then counts the group broken)."""
        try:
            return self._mesh.collective_link(peer, deadline)
        except (DistNetworkError, DistTimeoutError) as err:
            if isinstance(err, DistNetworkError):
                err.dead = err.rank in self.gindex and self._mesh.is_dead(self.gindex[err.rank])
                if err.dead:
                    raise
            exc = self._set_up_failed(err, peer)  # a timeout, or a stopped peer: the groups are told
            if exc is err:
                raise
            raise exc from None

    def _set_up_failed(self, err, peer: int):
        """The error for a failure of this group's collective link to group rank ``peer``,
        after telling the process's groups when it is a timeout: the peer never dialled in
        time (a DistTimeoutError), or it accepted and never answered the handshake (a
        stopped rank: a DistNetworkError before, as if it were lost)."""
        if isinstance(err, DistTimeoutError):
            self._stalled([self.granks[peer]], True, True)
            return err
        gpeer = self.gindex.get(err.rank)
        if gpeer is None or not _stalls.timed_out(err) or self._mesh.is_dead(gpeer):
            return err
        self._stalled([err.rank], True, True)
        return DistTimeoutError(f"group {self.ctx.group_name!r}: rank {self.granks[self.rank]}: connecting timed out; "
                                f"ranks not heard from: [{err.rank}] ({err})")

    def _tell_sides(self, rank: int, host, message: str) -> None:
        """``GroupFailure``'s first step on the group's first loss (global rank ``rank`` on
        ``host``): the process-wide record (``_losses``: a group built later fails at once
        instead of waiting for the dead member), then each side of this backend that does
        not know it yet (the mesh for links not taken yet or dialled later, the collective
        engine, the point-to-point side); each tells its own peers (ABORT ``lost``) and
        fails what waits, now and later: a survivor waiting on a live survivor fails at
        once, naming the dead rank. The process group learns it first (``report_loss``:
        every later op on it fails at once, revoked)."""
        if self.ctx.report_loss is not None:
            self.ctx.report_loss(rank, host, message)
        peer = self.gindex.get(rank)
        info = self._mesh.peer_info(peer) if peer is not None else None
        _losses.record_lost(self._mesh.job, rank, info, message)
        # links not taken yet, or dialled later
        self._mesh.abandon(self._lost_notice("lost", rank, host, message), (rank, host, message))
        eng = self._eng
        if eng is not None:
            eng.losses.notify_lost(rank, host, message)  # (nothing new to an engine that found it itself)
            # an idle engine tells its collective peers now, on this thread; a busy one
            # does it from the op that is waiting (woken by notify_lost) or the next one
            self._exec.run_inline(eng.losses.take_external)
        self._p2p.losses.record_lost(rank, host, message)  # (nothing new to the side that found it)

    def _lost_notice(self, kind: str, rank: int, host, message: str) -> bytes:
        """The mesh's lost notice (an ABORT frame of ``kind`` ``lost`` or ``stalled``, naming
        global rank ``rank``): what a rank that cannot build or keep the group writes on its
        collective links (both engines read it)."""
        body = F.pack_abort(kind, message, rank, host, ranks=[rank] if kind == "stalled" else None,
                            final=kind == "stalled")
        return F.pack(F.ABORT, 0, 0, 0, 0, F.group_hash(self.ctx.group_name), 0, 0, -1, 0, len(body)) + body

    def _tell_groups(self, rank: int, host, message: str) -> None:
        """``GroupFailure``'s last step: the other groups of this process that have global
        rank ``rank`` as a member record its loss too (a survivor that stopped after a loss
        in one group may be awaited in another)."""
        if not message.startswith("in group "):
            message = f"in group {self.ctx.group_name!r}: {message}"
        _losses.tell_groups(self.job, rank, host, message, self)

    def member_lost(self, rank: int, host, message: str) -> None:
        """The group learned that member ``rank`` (global) is lost (the member watch, or
        another backend of the group): recorded as a loss this backend found."""
        self.failure.record(rank, host, message)

    def group_revoked(self, rank: int, host, message: str) -> None:
        """The group is aborted for the loss of global rank ``rank``, which need not be a
        member (``ProcessGroup.revoke_for``: a member began shrink_group on the default
        group): recorded as a loss of that rank, so what waits here fails naming it, and
        this rank's peers in the group are told (ABORT ``lost``, the native group's failed
        state) and fail naming it too, never naming this rank."""
        self.failure.record(rank, host, message)

    def members_kept(self, ranks) -> None:
        """The survivors of a shrink kept global ``ranks`` (their member watch saw none of
        them go): one this group recorded lost (a connection to it failed) is forgotten
        process-wide (``_losses``), so the shrunk group connects to it."""
        for rank in ranks:
            peer = self.gindex.get(rank)
            if peer is not None and rank in self.failure.lost:
                _losses.forget(self._mesh.job, rank, self._mesh.peer_info(peer))

    def member_departed(self, rank: int, host, message: str) -> None:
        """The group learned that member ``rank`` (global) left: its process exited, or it
        destroyed the group. What it sent before is delivered (its streams end after it);
        a connection to it, or a wait for its dial, fails at once."""
        peer = self.gindex.get(rank)
        if peer is not None and peer != self.rank:
            self._mesh.depart(peer, message, host if host not in (None, "?") else None)

    def _stalled(self, ranks, engine: bool = False, final: bool = False) -> None:
        """A wait of this group passed its deadline on global ``ranks`` (``final``: it raised
        naming them): the other groups of this process and this group's other side tell
        their peers (``_stalls``)."""
        _stalls.tell(self, ranks, engine, final)

    # ------------------------------------------------ what the process's other groups ask
    # (failure/_losses, failure/_stalls: the groups of one process tell each other)
    @property
    def closed(self) -> bool:
        """Closed (``close``): the executor's ``state.closed``, the one flag, which the C core's
        claim reads too (``native/clane.c``, ``LaneState``)."""
        return self._exec.state.closed

    def tell_stalled(self, ranks, engine: bool, final: bool) -> None:
        """This process waits on global ``ranks`` (``final``: it raised naming them): this
        group tells its point-to-point peers, and its collective peers when its collectives
        are idle (``engine``)."""
        self._p2p.stalls.tell_stalled(ranks, final)
        eng, nat = self._eng, self._native
        if engine and eng is not None:
            # (run_inline: only when no op runs or is queued there; then on this thread)
            self._exec.run_inline(lambda: nat.tell_stalled(ranks, final) if nat is not None else
                                  eng.stalls.tell_stalled_idle(ranks, self._exec.seq + 1, final))

    def notice_of(self, grank: int) -> list:
        """The global ranks a timeout notice from global rank ``grank`` names (this rank
        left out), as this group's point-to-point side heard it; [] when none (or not a
        member)."""
        peer = self.gindex.get(grank)
        return self._p2p.stalls.notice_of(peer) if peer is not None else []

    def _attach_native(self, peers) -> None:
        """Run the group's collectives on the native engine when ``_engines.select`` says so:
        over shared memory (every rank on this host, with the same native slots), mapping
        every peer's file; or over the group's TCP streams (every rank offers it)."""
        if self._nfile is None and not self._tcp_offer:
            return
        infos = {p: self._mesh.peer(p) for p in peers}
        hosts = _twolevel.host_split(self.granks) or self._links.hosts  # (NDIST_NATIVE_HOSTS: testing on one host)
        spans = len(set(hosts)) > 1
        kind = select(self._nfile.slot if self._nfile is not None else 0, peers, self._links.same_host, infos,
                      self._tcp_offer, spans, _native.TCP_MAX_RANKS, hosts)
        if kind == NATIVE_TCP:
            mod = _native.extension()
            self._run_native(mod, self._attach_tcp(mod, peers), peers)
            return
        if kind == NATIVE_TWO:
            self._run_native(self._native_mod, self._attach_two(peers, infos, hosts), peers)
            return
        if kind != NATIVE:
            return
        try:
            group = _native.attach(self._native_mod, self._nfile, {p: i["shm"] for p, i in infos.items()},
                                   {p: i["pid"] for p, i in infos.items()}, self.rank, self.size, self._timeout,
                                   _native.spins(self.size))
        except _native.PeerFileGone as gone:  # (its files go when it closes the group or its job sweeps them)
            self._peer_file_gone(gone.args[0])
        self._run_native(self._native_mod, group, peers)

    def _attach_two(self, peers, infos: dict, hosts):
        """The two-level group (``native/_twolevel.py``): this host's ranks over shared memory
        (mapping their files), every rank over TCP."""
        mod = self._native_mod
        mine = [r for r in range(self.size) if hosts[r] == hosts[self.rank]]
        local = None
        if len(mine) > 1:
            try:
                local = _native.attach(mod, self._nfile, {i: infos[r]["shm"] for i, r in enumerate(mine) if r in infos},
                                       {i: infos[r]["pid"] for i, r in enumerate(mine) if r in infos},
                                       mine.index(self.rank), len(mine), self._timeout,
                                       _native.spins(len(mine)))
            except _native.PeerFileGone as gone:
                self._peer_file_gone(mine[gone.args[0]])
        try:
            tcp = self._attach_tcp(mod, peers, local)
        except BaseException:
            if local is not None:
                local.close()  # (after _attach_tcp failed it naming the cause: the failure stays)
            raise
        return _twolevel.TwoLevelGroup(mod, local, tcp, hosts, self.rank, self.granks, _twolevel.min_bytes())

    def _peer_file_gone(self, p: int):
        """Raise for group rank ``p``'s native file gone before this rank's first collective."""
        g, host = self.granks[p], self._mesh.host_of(p)
        how = "its process exited" if self._mesh.is_dead(p) else (
            "it closed the group (destroy_process_group or exit)")
        raise DistNetworkError(f"group {self.ctx.group_name!r}: rank {g} ({host}) left before this rank's first "
                               f"collective on the group: {how}", rank=g, host=host) from None

    def _attach_tcp(self, mod, peers, local=None):
        """The native group over TCP: every collective link opened now (``_open_link``: its
        failures as the Python engine's first use of it), handed to C. ``local``: the
        two-level form's same-host group, already attached, whose peers may wait on this
        rank in the set-up barrier: a failure here fails it naming the same cause."""
        deadline = time.monotonic() + self._timeout
        socks, facts = {}, {}
        p = None
        try:
            for p in peers:
                socks[p], facts[p] = self._open_link(p, deadline)
        except BaseException as err:
            # the peers linked so far may wait on this rank in the set-up: each is told why it
            # fails (the lost notice naming the rank that could not be linked: a timeout
            # names the peer waited for), not left to find a connection ended with no reason
            # and name this live rank
            notice, code = None, -1  # (code: the local group's cause, as TwoLevelGroup.fail takes it)
            if isinstance(err, DistTimeoutError):  # the peer waited for
                host = getattr(err, "host", None) or self._mesh.host_of(p)
                notice = self._lost_notice("stalled", self.granks[p], host, str(err))
                code = -2 - (mod.STALL_GLOBAL + self.granks[p])
            elif isinstance(err, DistNetworkError) and isinstance(getattr(err, "rank", None), int):  # the rank lost
                host = getattr(err, "host", None) or (self._mesh.host_of(p) if err.rank == self.granks[p] else "?")
                notice = self._lost_notice("lost", err.rank, host, str(err))
                code = mod.STALL_GLOBAL + err.rank
            if local is not None:
                # its peers wait on this rank in the set-up barrier: they name the cause, not
                # this live rank "closing the group" (a kill trial's SIGSTOPped rank)
                local.fail(code)
            for sock in socks.values():
                if notice is not None:
                    self._mesh.tell_and_keep(sock, notice)
                else:
                    sock.close()
            raise
        here = _net.machine_of(self._mesh.hostid)  # (ranks sharing this machine's CPUs: whether to spin)
        sharing = 1 + sum(_net.machine_of(self._mesh.peer(p)["hostid"]) == here for p in peers)
        return _native.attach_tcp(mod, socks, self.rank, self.size, self._timeout, sharing, facts)

    def _run_native(self, mod, group, peers) -> None:
        """Run the collectives on native ``group`` (of module ``mod``): the algorithms, the
        failure hooks, then a set-up barrier."""
        nat = _native.NativeAlgorithms(mod, group, self.rank, self.size, self.ctx.group_name,
                                       wait_warning_from_env(), self.granks, self._exec.state)
        self._native = self._alg = self._pending.native = nat
        self.failure.hooks.append(self._native_loss)
        self._native.on_stalled = self._stalled
        first = self.failure.first
        if first is not None:  # recorded while attaching, before the hook was in place (another thread):
            self._native_loss(*first)  # broken now; ``_engine`` raises it, and no set-up barrier waits for it
            return
        # every rank has mapped every file (or linked every peer) before any rank may finish an op
        # and unlink its own
        self._mesh.connecting = [self.granks[p] for p in peers]  # (what a wait meanwhile names)
        try:
            group.barrier()
        except (mod.Error, RuntimeError) as err:  # (the first wait on the group)
            # (RuntimeError: a compiled group refused a step, broken meanwhile by a loss the
            # watcher recorded first: ``_native_failure`` gives that loss; else it is raised)
            hosts = {p: self._mesh.host_of(p) for p in peers}
            exc = self._native_failure(nat, err, "the group's set-up", hosts)
            if exc is err and not isinstance(err, mod.Error):
                raise
            nat.broken = exc
        finally:
            self._mesh.connecting = []
        log.debug("rank %d: group %r runs on the native engine", self.rank, self.ctx.group_name)

    @property
    def engine(self) -> str:
        """``"native"`` or ``"python"``: the engine that runs this group's collectives
        (decided at the first collective; before it, the engine it will use)."""
        if self._eng is None:
            return "native" if (self._nfile is not None or self._tcp_offer == "always") and self.size > 1 else "python"
        return NATIVE if self._native is not None else PYTHON

    # ------------------------------------------------------------ the C interface
    def engine_handle(self, book, failed, reduce_op, check_signature, t_done: int) -> int:
        """The engine's C interface handle of this group (``ndist_engine.h``; docs/native.md,
        "The C interface"), made on the first request and closed with the group. The group
        must have run a collective (its set-up) on the native engine (a same-host ``Group``, a
        ``TcpGroup`` or two levels); ``book`` and the rest are the public layer's
        (``native/_capi.Handle``)."""
        if self._capi is None:
            name = self.ctx.group_name
            if self.closed:
                raise ValueError(f"group {name!r}: expected a live group, got a destroyed one")
            if self._eng is None:
                raise ValueError(f"group {name!r}: expected a group that ran a collective (its set-up), got one "
                                 f"that has not run any")
            nat = self._native
            if nat is None:
                raise ValueError(f"group {name!r}: expected a group on the native engine, got one on the "
                                 f"{self.engine} engine")
            lane = _fast.core(self, nat, self._exec, book, failed)  # (None under DETAIL)
            self._capi = _capi.Handle(self, nat, book, failed, reduce_op, check_signature, t_done, lane,
                                      self._exec.wake)
        return self._capi.value

    def recorder_types(self):
        """The flight recorder's ring and counter types for this group's recorder
        (``FlightRecorder.adopt``, asked when the public layer makes the group's lane): the C
        ones the repeated call in C writes (``native/crecord.c``), or None (the Python
        engine, nothing built, a group of one: no FastLane)."""
        return _native.recorder_types(self.ctx.options) if self.size > 1 else None

    def fast_lane(self, plain, failed):
        """The group's repeated call in one C call (``native/_fast.py``, ``_cnative.FastLane``),
        asked by the public layer's Python lane ``plain`` after a call it ran: the FastLane
        once the group runs the native engine (one level or two), None while the engine is not
        chosen yet (ask again later), False for good (the Python engine, closed, a group of
        one)."""
        if self.closed or self.size == 1:
            return False
        if self._eng is None:
            return None
        nat = self._native
        if nat is None:
            return False
        return _fast.make(self, nat, self._exec, plain, failed) or False

    def claim_lane(self) -> int:
        """The C interface's lane claim (``native/_capi.py``): ``Executor.claim``, as the thin
        lane takes it, waiting first (up to the group timeout) for queued or running work,
        which the thin lane would queue behind. Returns the op's sequence number; the caller
        ends it with ``leave_lane``."""
        ex = self._exec
        deadline = time.monotonic() + self._timeout
        while True:
            if self.closed:
                raise DistNetworkError(f"{self!r} is closed")
            seq = ex.claim()
            if seq:
                return seq
            if not ex.drain(deadline):
                raise DistTimeoutError(f"group {self.ctx.group_name!r}: a call through the C interface waited "
                                       f"{self._timeout:.0f} s for the group's queued collectives")

    def leave_lane(self) -> None:
        self._exec.leave()

    def native_failure(self, nat, err: BaseException) -> BaseException:
        """The C interface's failure mapping: the thin lane's (``_native_failure``)."""
        return self._native_failure(nat, err)

    def _native_failure(self, nat, err: BaseException, desc: str | None = None, hosts=None) -> BaseException:
        """What an op on the native engine raises for ``err``: a ``_cnative.Error`` turns
        into its typed error (the group broken, a dead peer's files unlinked, a lost member
        recorded), anything else (a signal, NumPy's reduction failed) is ``err`` itself,
        the group then broken by it. ``desc`` / ``hosts``: the group's set-up says what
        failed and knows the hosts before the engine does (default: the running op's)."""
        if isinstance(err, nat.mod.Error):
            hosts = self._eng.hosts if hosts is None else hosts
            exc = nat.error(err, self.ctx.group_name, nat.desc() if desc is None else desc, hosts, self._timeout)
            if err.args[0] == "dead":
                self._peer_died(err.args[1])
            if nat.g.broken and nat.broken is None:
                nat.broken = exc
            if (err.args[0] in ("dead", "failed", "lost", "abort") and isinstance(exc, DistNetworkError)
                    and exc.rank is not None):
                # the point-to-point side and this process's other groups learn it too
                host = exc.host
                if exc.rank not in self.gindex and host in (None, "?"):  # (a rank outside the group: revoke_for)
                    host = exc.host = _losses.host_of(self.job, exc.rank)
                self.failure.record(exc.rank, host, str(exc).split(": ", 1)[-1])
            return exc
        if nat.g.broken and nat.broken is None:
            nat.broken = err if isinstance(err, DistError) else DistBackendError(
                f"group {self.ctx.group_name!r}: {nat.desc()} was interrupted ({err!r}); the group is broken")
        elif nat.g.broken and type(err) is RuntimeError:
            # a compiled group refused a step ("broken by an earlier failure"): a two-level op's
            # groups were failed between two of its steps (``mark_lost`` on the loss watcher's
            # thread, which sets ``broken`` first): that failure is the op's error
            return nat.broken
        return err

    def _inline(self, nat, lane_op, a, b, c=None, d=None) -> bool:
        """The thin lane of a blocking op on the native engine: when nothing runs or is
        queued on this group (and it is open), run ``lane_op(seq, a, b, c, d)`` (a
        ``NativeAlgorithms.lane_*`` method; four arguments rather than ``*args``, which
        cost ~1.3k instructions more per call) on this thread, with no closure, Work or
        executor job, and return True; else False (the op then goes through
        ``_submit``). Numbered by the executor (``Executor.claim``), described, and failing
        with the typed errors, as ``_submit``'s job does."""
        ex = self._exec
        seq = ex.claim()  # (0 when closed)
        if not seq:
            return False
        try:
            if nat.broken is not None:  # as the Python engine: the first failure, again
                raise nat.broken
            lane_op(seq, a, b, c, d)
        except BaseException as err:
            exc = self._native_failure(nat, err)
            if exc is err:
                raise
            raise exc from None
        finally:
            ex.leave()
        return True

    def _submit(self, name: str, arr, count: int, root, body, blocking: bool, outputs=None, redop=None) -> Work:
        seq = self._exec.number()
        dcode = F.dtype_code(arr.dtype) if arr is not None else 0
        root_v = -1 if root is None else root

        def job():
            eng = self._eng or self._engine()
            nat = self._native
            if nat is not None:
                if nat.broken is not None:  # as the Python engine: the first failure, again
                    raise nat.broken
                nat.g.seq = seq
                nat.op = (name, dcode, count, seq, root_v, redop)
                try:
                    body()
                except BaseException as err:
                    exc = self._native_failure(nat, err)
                    if exc is err:
                        raise
                    raise exc from None
                return
            eng.begin(OpInfo(name, dcode, count, root_v, seq, self.rank, F.redop_code(redop), self.granks),
                      self._timeout)
            try:
                body()
                eng.finish()
            except BaseException as err:
                eng.fail(err)
                if isinstance(err, DistNetworkError) and self.gindex.get(err.rank) in self._links.same_host:
                    self._peer_died(self.gindex[err.rank])
                raise

        if self.closed:
            work = Work(name, seq, outputs)
            work.fail(DistNetworkError(f"{self!r} is closed"))
            return work
        # a blocking call on an idle group runs on this thread and returns the shared
        # DONE (no Work, no Future): its errors propagate from here
        if blocking and self._exec.run_inline(job):
            return DONE
        work = Work(name, seq, outputs)
        work.pending = self._pending.describe(work)
        return self._exec.submit(work, job, blocking)

    def _native_loss(self, rank: int, host: str, message: str) -> None:
        """A ``GroupFailure.hooks`` entry: a member is lost, learnt outside the
        native engine (e.g. by the point-to-point side): same-host ranks waiting in the
        native engine, here or on another rank, raise naming ``rank`` at once, and later
        collectives raise the same error."""
        if self._native is not None:
            self._native.mark_lost(DistNetworkError(
                f"group {self.ctx.group_name!r}: rank {rank} ({host}) is lost: {message}", rank=rank, host=host))

    def _peer_died(self, peer: int) -> None:
        try:
            prefix = self._mesh.peer(peer)["shm"]
        except Exception:  # noqa: BLE001
            return
        n = unlink_prefix(prefix)
        self._peer_segs.drop(peer)
        if n:
            log.info("unlinked %d shared-memory segment(s) of dead rank %d", n, peer)

    # ------------------------------------------------------------ reductions
    # The thin lane (``_inline``): a blocking op on the native engine with nothing running
    # or queued runs here, on the caller's thread, with no closure, Work or executor job;
    # numbered, described and failing as through ``_submit``. The record's fields are
    # read by name (a few ns each more than by index: docs/architecture.md, "The collectives layer", `Call`).
    def all_reduce(self, call: Call, *, blocking: bool = False) -> Work:
        buf, op, scale = call.out, call.redop, call.scale
        if self.size == 1:
            finalize(buf, op, scale, 1)
            return _trivial("all_reduce", blocking, [buf])
        nat = self._native
        if blocking and nat is not None and self._eng is not None and self._inline(
                nat, nat.lane_all_reduce, buf, op, scale):
            return DONE
        return self._submit("all_reduce", buf, buf.size, None,
                            lambda: self._alg.all_reduce(buf, op, scale), blocking, [buf], op)

    def reduce(self, call: Call, *, blocking: bool = False) -> Work:
        buf, op, scale, dst = call.out, call.redop, call.scale, call.root
        if self.size == 1:
            finalize(buf, op, scale, 1)
            return _trivial("reduce", blocking, [buf])
        return self._submit("reduce", buf, buf.size, dst, lambda: self._alg.direct_reduce(buf, op, scale, root=dst),
                            blocking, [buf], op)

    def reduce_scatter(self, call: Call, *, blocking: bool = False) -> Work:
        return self._reduce_scatter(call.out, call.inputs, call.redop, call.scale, blocking)

    def reduce_scatter_from(self, call: Call, *, blocking: bool = False) -> Work:
        out, inp, splits, op, scale = call.out, call.inp, call.in_splits, call.redop, call.scale
        nat = self._native
        # the lane passes even splits as the one buffer (the C engine cuts it: no views)
        if blocking and nat is not None and self._eng is not None and self._inline(
                nat, nat.lane_reduce_scatter, out, inp if splits is None else split_views(inp, splits, self.size),
                op, scale):
            return DONE
        return self._reduce_scatter(out, split_views(inp, splits, self.size), op, scale, blocking)

    def _reduce_scatter(self, out, inputs, op, scale, blocking: bool) -> Work:
        if self.size == 1:
            np.copyto(_u8(out), _u8(inputs[0]))
            finalize(out, op, scale, 1)
            return _trivial("reduce_scatter", blocking, [out])
        nat = self._native
        if blocking and nat is not None and self._eng is not None and self._inline(
                nat, nat.lane_reduce_scatter, out, inputs, op, scale):
            return DONE
        return self._submit("reduce_scatter", out, out.size, None,
                            lambda: self._alg.reduce_scatter(out, inputs, op, scale), blocking, [out], op)

    # ------------------------------------------------------------ movement
    def broadcast(self, call: Call, *, blocking: bool = False) -> Work:
        buf, src = call.out, call.root
        if self.size == 1:
            return _trivial("broadcast", blocking, [buf])
        nat = self._native
        if blocking and nat is not None and self._eng is not None and self._inline(nat, nat.lane_broadcast, buf,
                                                                                   src):
            return DONE
        return self._submit("broadcast", buf, buf.size, src, lambda: self._alg.broadcast(buf, src), blocking,
                            [buf])

    def all_gather(self, call: Call, *, blocking: bool = False) -> Work:
        return self._all_gather(call.outputs, call.inp, blocking)

    def all_gather_into(self, call: Call, *, blocking: bool = False) -> Work:
        out, inp, splits = call.out, call.inp, call.out_splits
        nat = self._native
        if blocking and nat is not None and self._eng is not None and self._inline(
                nat, nat.lane_all_gather, out if splits is None else split_views(out, splits, self.size), inp):
            return DONE
        # natively too: per-rank views of ``out`` (no second record, no _replace)
        return self._all_gather(split_views(out, splits, self.size), inp, blocking)

    def _all_gather(self, outputs, inp, blocking: bool) -> Work:
        nat = self._native
        if blocking and nat is not None and self._eng is not None and self._inline(nat, nat.lane_all_gather,
                                                                                   outputs, inp):
            return DONE
        return self._submit("all_gather", inp, inp.size, None, lambda: self._alg.all_gather(outputs, inp),
                            blocking, outputs)

    def gather(self, call: Call, *, blocking: bool = False) -> Work:
        outputs, inp, dst = call.outputs, call.inp, call.root
        return self._submit("gather", inp, inp.size, dst, lambda: self._alg.gather(outputs, inp, dst), blocking,
                            outputs if self.rank == dst else [])

    def scatter(self, call: Call, *, blocking: bool = False) -> Work:
        out, inputs, src = call.out, call.inputs, call.root
        return self._submit("scatter", out, out.size, src, lambda: self._alg.scatter(out, inputs, src), blocking,
                            [out])

    def all_to_all(self, call: Call, *, blocking: bool = False) -> Work:
        return self._all_to_all(call.outputs, call.inputs, blocking)

    def all_to_all_single(self, call: Call, *, blocking: bool = False) -> Work:
        n, out, inp, osplits, isplits = self.size, call.out, call.inp, call.out_splits, call.in_splits
        nat = self._native
        # the lane hands C the two buffers, and the split sizes when there are any (C cuts them)
        if blocking and nat is not None and self._eng is not None and self._inline(
                nat, nat.lane_all_to_all, out, inp, inp, None if osplits is None and isplits is None else
                (osplits or [out.size // n] * n, isplits or [inp.size // n] * n)):
            return DONE
        # no split sizes: the call promises every rank splits evenly (what Bruck needs)
        return self._all_to_all(split_views(out, osplits, n), split_views(inp, isplits, n), blocking,
                                even=osplits is None and isplits is None)

    def _all_to_all(self, outputs, inputs, blocking: bool, even: bool = False) -> Work:
        count = sum(a.size for a in inputs)
        return self._submit("all_to_all", inputs[0], count, None,
                            lambda: self._alg.all_to_all(outputs, inputs, even), blocking, outputs)

    def barrier(self, call: Call, *, blocking: bool = False) -> Work:
        if self.size == 1:
            return _trivial("barrier", blocking)
        nat = self._native
        if blocking and nat is not None and self._eng is not None and self._inline(nat, nat.lane_barrier, None, None):
            return DONE
        return self._submit("barrier", None, 0, None, lambda: self._alg.barrier(), blocking)

    # ------------------------------------------------------------ point to point
    def send(self, call: Call, *, blocking: bool = False) -> Work:
        buf, dst, tag = call.out, call.root, call.tag
        work = Work("send", -1, [])
        if self.closed:
            work.fail(DistNetworkError(f"{self!r} is closed", rank=self.granks[dst]))
            return work
        # (a blocking send waits too when it is queued behind another send)
        work.pending = lambda: self._p2p.stalls.pending_send(dst, tag, work, self._p2p_exec.current)
        return self._p2p_exec.submit(work, lambda: self._p2p.send(buf, dst, tag), blocking)

    def recv(self, call: Call, *, blocking: bool = False) -> Work:
        work = Work("recv", -1, None)
        src = call.root
        if self.closed:
            work.fail(DistNetworkError(f"{self!r} is closed", rank=None if src is None else self.granks[src]))
            return work
        work.pending = lambda: self._p2p.stalls.pending_recv(src, call.tag, work)
        self._p2p.post(call.out, call.root, call.tag, work)
        return work

    # ------------------------------------------------------------ lifetime
    def close(self) -> None:
        if self.closed:
            return
        # first: every claim refuses from here on, the C core's too (native/clane.c, LaneState);
        # the executor fails its queued jobs below (``Executor.close``)
        self._exec.state.closed = True
        self.failure.closed = True  # (closing: peers end their streams too)
        self._p2p.flush()  # what this rank sent is read before its connections close
        ex = self._exec
        if self._eng is not None and ex.idle():
            # a peer may not have mapped our segment yet for the last op
            self._eng.drain_acks(min(self._timeout, 10.0))
        conns = []
        if self._eng is not None:
            self._eng.closing = True
            conns = list(self._eng.conns.values())
        for c in conns:  # wakes an op blocked in poll: it fails instead of waiting
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._mesh.close()
        self._exec.close("backend closed")
        self._p2p_exec.close("backend closed")
        self._p2p.close()
        for c in conns:
            c.sock.close()
        self._seg.close()
        if self._rings is not None:
            self._rings.unlink()
        if self._capi is not None:
            self._capi.close()  # calls on its handle return NDIST_E_CLOSED
        if self._native is not None:
            self._native.g.close()  # a peer still waiting on this rank fails instead of waiting
            self._native.lanes.clear()  # its FastLanes go now, not at a collector's pass (each holds the backend)
        if self._nfile is not None:
            self._nfile.unlink()  # peers keep their mappings: what was posted stays readable
        self._peer_segs.clear()

    def __del__(self):
        try:
            ex = getattr(self, "_exec", None)  # (None: __init__ failed before it)
            if ex is None or not ex.state.closed:
                self._seg.close()
                if self._rings is not None:
                    self._rings.unlink()
        except Exception:  # noqa: BLE001
            pass
