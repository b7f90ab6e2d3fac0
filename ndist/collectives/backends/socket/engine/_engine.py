"""The collective progress engine: one non-blocking stream per peer, driven
inline by whichever thread runs the current collective.

An algorithm is a few *steps*; a step queues frames to peers and expects one
frame from some peers, then ``step()`` moves bytes (``sendmsg`` of
memoryviews, ``recv_into`` the destination or a reused scratch buffer, or a
view of the sender's shared-memory segment) until all of it is done. Every
header is checked against what this rank's call expects; frames of an older,
failed op are drained, a frame of a newer op stays queued for the next one,
so a mismatch fails one op on every rank involved and the next matched op
works. Waiting spins briefly (only when every rank has a core), then retries
with ``sched_yield`` for up to 2 ms (a peer that is not asleep needs no
wake-up), then blocks in ``poll``.

Frames in and out, and the header checks: ``engine/_frame_io``. A lost peer (this
engine's own finding, a peer's ``lost`` notice, or the backend's point-to-point
side): ``_engine_loss``. Messages name global ranks.
"""

from __future__ import annotations

import logging
import os
import select
import time
from collections import deque

import numpy as np

from .....runtime import DistMismatchError, DistNetworkError, DistTimeoutError
from ..wire import _frame as F
from ..wire import _ring
from ._frame_io import Expect, FrameIO
from ..failure._engine_loss import LossHandling
from ..failure._engine_stall import StallHandling
from ._conns import Conns, LinkHandling

__all__ = ["Engine", "OpInfo", "Expect"]

log = logging.getLogger("ndist.collectives.socket")

_POLLIN, _POLLOUT = select.POLLIN, select.POLLOUT
#: how long a rank spins on its streams before blocking in poll (only when the
#: group has no more ranks than this host has cores)
SPIN_S = 15e-6
#: after the spin, how long a rank keeps polling its streams with ``sched_yield``
#: between tries before blocking in poll (also when ranks outnumber cores). A peer
#: that is not asleep needs no wake-up: its sender's ``sendmsg`` is not charged a
#: context switch, and the waiter gives its core to anyone runnable on every try
#: (with 4 ranks on 2 cores this halved a 4 KiB all_reduce: 280-340 -> 140-230 us).
YIELD_S = 2e-3
_yield = os.sched_yield
WAIT_WARNING_ENV = "NDIST_WAIT_WARNING"
#: a collective waiting longer than this logs a warning, then one a minute
DEFAULT_WAIT_WARNING = 60.0
WARNING_EVERY = 60.0
_POLLERR = select.POLLERR | select.POLLHUP | select.POLLNVAL


def wait_warning_from_env() -> float:
    """Seconds from ``NDIST_WAIT_WARNING`` (default 60; 0 turns the warning off)."""
    raw = os.environ.get(WAIT_WARNING_ENV, "").strip()
    if not raw:
        return DEFAULT_WAIT_WARNING
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{WAIT_WARNING_ENV}: expected a number of seconds (0: no warning), got {raw!r}") from None
    if value != value or value < 0:
        raise ValueError(f"{WAIT_WARNING_ENV}: expected a number of seconds >= 0, got {raw!r}")
    return value if value > 0 else float("inf")


class OpInfo:
    __slots__ = ("name", "code", "dtype", "count", "root", "seq", "rank", "redop", "granks")

    def __init__(self, name, dtype_code, count, root, seq, rank, redop=0, granks=None):
        self.name = name
        self.code = F.op_code(name)
        self.dtype = dtype_code
        self.count = count
        self.root = root
        self.seq = seq
        self.rank = rank
        self.redop = redop  # F.redop_code of a reduction's op: every frame carries it
        self.granks = granks  # global rank of each group rank: messages name global ranks

    @property
    def desc(self) -> str:
        g = self.granks
        if g is None:
            return F.describe(self.rank, self.code, self.dtype, self.count, self.seq, self.root, self.redop)
        root = g[self.root] if self.root is not None and 0 <= self.root < len(g) else self.root
        return F.describe(g[self.rank], self.code, self.dtype, self.count, self.seq, root, self.redop)


class _Conn:
    __slots__ = ("peer", "grank", "host", "sock", "fd", "out", "hdr", "hview", "hgot", "held", "pay", "pgot", "on_pay",
                 "drain", "dead", "ring_out", "ring_in", "stall")

    def __init__(self, peer, host, sock, grank=None):
        self.peer = peer  # group rank
        self.grank = peer if grank is None else grank  # its global rank: what messages name
        self.host = host
        self.sock = sock
        sock.setblocking(False)
        self.fd = sock.fileno()
        self.out: deque = deque()
        self.hdr = bytearray(F.HDR_SIZE)
        self.hview = memoryview(self.hdr)
        self.hgot = 0
        self.held = None  # a parsed header of a later op, not consumed yet
        self.pay = None  # memoryview being filled
        self.pgot = 0
        self.on_pay = None
        self.drain = 0
        self.dead = None
        # shared-memory rings replacing the socket's byte stream (same host): the
        # socket then only carries doorbells and shows the peer's death
        self.ring_out = None
        self.ring_in = None
        self.stall = None  # (seq, global ranks) of the peer's last timeout notice (_engine_stall)


class Engine(FrameIO, LossHandling, StallHandling, LinkHandling):
    def __init__(self, rank, size, group_name, socks: dict, hosts: dict, shm_prefixes: dict, peer_segs,
                 own_seg, spin: bool, granks=None, opener=None, on_link=None):
        self.rank = rank
        self.size = size
        self.group_name = group_name
        self.ghash = F.group_hash(group_name)
        #: global rank of each group rank: every message and ``.rank`` names global ranks
        self.granks = tuple(granks) if granks is not None else tuple(range(size))
        self.hosts = hosts
        #: ``opener(peer, deadline) -> (socket, facts)`` opens the collective link to a
        #: peer (``Mesh.collective_link``); ``on_link(conn, facts)`` wires its rings and CMA
        self.opener = opener
        self.on_link = on_link
        self.conns = Conns({p: _Conn(p, hosts[p], s, self.granks[p]) for p, s in socks.items()})
        self.conns.eng = self
        self._by_fd = {c.fd: c for c in self.conns.values()}
        self.prefixes = shm_prefixes
        self.peer_segs = peer_segs
        self.own_seg = own_seg
        self.spin = spin
        self.op: OpInfo | None = None
        self.deadline = 0.0
        self.broken: BaseException | None = None
        self.refs_out: set = set()
        self.refs_in: set = set()
        self.unacked: set = set()
        self.unacked_seq = -1
        self.acked: set = set()
        self._scratch: dict = {}
        self._dirty: set = set()  # peers with frames of this op still to flush
        self.closing = False
        #: pid of each same-host peer whose memory this rank may read (CMA)
        self.cma_pids: dict = {}
        self.spin_s = SPIN_S if spin else 0.0
        self.yield_s = YIELD_S
        self._waiting: list = []
        self.wait_warning = wait_warning_from_env()
        self._began = 0.0
        self._warn_at = float("inf")
        self._init_losses()
        self._init_stalls()

    # ----------------------------------------------------------- helpers
    def new_conn(self, peer, host, sock, grank) -> _Conn:
        return _Conn(peer, host, sock, grank)

    def frame(self, kind, step, nbytes, flags=0, offset=0) -> bytes:
        op = self.op
        gen = self.own_seg.gen if flags & F.F_SHM else 0
        return F.pack(kind, op.code, op.dtype, step, flags, self.ghash, gen, op.seq, op.root, op.count,
                      nbytes, offset, op.redop)

    def send(self, peer, step, data: np.ndarray | None = None, shm_offset: int | None = None,
             nbytes: int = 0) -> None:
        """Queue a DATA frame: ``data`` inline, or ``nbytes`` at ``shm_offset`` of our segment."""
        conn = self.conns[peer]
        self._dirty.add(peer)
        if shm_offset is not None:
            conn.out.append(memoryview(self.frame(F.DATA, step, nbytes, F.F_SHM, shm_offset)))
            self.refs_out.add(peer)
            return
        n = 0 if data is None else data.nbytes
        conn.out.append(self.frame(F.DATA, step, n))
        if n:
            conn.out.append(memoryview(data).cast("B"))

    def send_cma(self, peer, step, data: np.ndarray) -> None:
        """Queue a DATA frame naming ``data``'s address: the peer reads it from our memory.
        ``data`` must stay unchanged until the peer said it is done (the algorithm waits)."""
        self._dirty.add(peer)
        self.conns[peer].out.append(memoryview(self.frame(F.DATA, step, data.nbytes, F.F_CMA,
                                                          int(data.ctypes.data))))

    def scratch(self, peer, nbytes) -> np.ndarray:
        buf = self._scratch.get(peer)
        if buf is None or buf.nbytes < nbytes:
            buf = np.empty(max(4096, 1 << (max(nbytes, 1) - 1).bit_length()), dtype=np.uint8)
            self._scratch[peer] = buf
        return buf[:nbytes]

    def pending(self) -> str:
        if self.op is None:
            return "no collective running"
        return f"running {self.op.desc}; ranks not heard from: {self.not_heard_from()}"

    def not_heard_from(self) -> list:
        """Global ranks the current step still waits on (empty when idle)."""
        g = self.granks
        return sorted({g[e.peer] for e in self._waiting if not e.done}) if self.op is not None else []

    def _granks(self, peers) -> list:
        g = self.granks
        return sorted({g[p] for p in peers})

    def _describe_peer(self, conn, h) -> str:
        """The call a peer's header names, with global ranks."""
        g = self.granks
        root = g[h.root] if 0 <= h.root < len(g) else h.root
        return F.describe(conn.grank, h.op, h.dtype, h.count, h.seq, root, h.redop)

    def _warn_stall(self, expects, now: float) -> None:
        """The op has waited ``NDIST_WAIT_WARNING`` seconds (then each minute): say on what."""
        self._warn_at = now + WARNING_EVERY
        if self.op is None:
            return
        waiting = self._granks(e.peer for e in expects if not e.done)
        unsent = self._granks(c.peer for c in self.conns.values() if c.out)
        log.warning("group %r: %s has waited %.0f s; ranks not heard from: %s%s (it fails at the group "
                    "timeout, in %.0f s)", self.group_name, self.op.desc, now - self._began, waiting,
                    f"; ranks not reading: {unsent}" if unsent else "", max(0.0, self.deadline - now))

    # ----------------------------------------------------------- op frame
    def begin(self, op: OpInfo, timeout: float) -> None:
        if self.broken is not None:
            raise self.broken
        self.op = op
        if self.external is not None:
            try:
                self.take_external()
            finally:
                self.op = None
        if self.told_stalled:  # peers hold this rank's timeout notice: it goes on (_engine_stall)
            self.withdraw_stall(op)
        now = time.monotonic()
        self.deadline = now + timeout
        self.timeout = timeout
        self.in_grace = False
        self._began = now
        self._warn_at = now + self.wait_warning
        if self.refs_out:
            self.refs_out = set()
        if self.refs_in:
            self.refs_in = set()
        if self.acked:
            self.acked = set()
        self._dirty.clear()

    def segment(self, nbytes: int) -> np.ndarray:
        """Our segment, at least ``nbytes``, once no peer still reads an older op from it.

        Readers acknowledge after their op ends; we only wait for those ACKs here,
        before overwriting, so an op never waits a round trip for them.
        """
        if self.unacked:
            self.step([Expect(p, kind=-1) for p in sorted(self.unacked)])
        self.own_seg.reserve(nbytes)
        return self.own_seg.buf

    def drain_acks(self, timeout: float) -> None:
        """Before our segment goes away: wait (bounded) until peers that may still
        map it for our last op have acknowledged, died or closed."""
        if not self.unacked or self.broken is not None or self.external is not None:
            return
        self.deadline = time.monotonic() + timeout
        try:
            self.step([Expect(p, kind=-1) for p in sorted(self.unacked)])
        except Exception as err:  # noqa: BLE001 - closing: the peer is gone or slow
            log.debug("closing without all shared-memory ACKs: %s", err)

    def finish(self) -> None:
        """End of a successful op: release the peers' segments we read."""
        if self.refs_in:
            for p in self.refs_in:
                self.conns[p].out.append(memoryview(self.frame(F.ACK, 255, 0)))
                self._dirty.add(p)
            self.acking = True
            try:
                self.step([])
            except DistNetworkError as err:
                # this op has all its data; a reader that already closed (e.g. it
                # finished and destroyed the group) only fails the ops after it
                # (and is not reported to the backend as lost: it may have left)
                log.debug("ACK not delivered: %s", err)
                self._dirty.clear()
            finally:
                self.acking = False
        if self.refs_out:
            self.unacked = self.refs_out - self.acked
            self.unacked_seq = self.op.seq
        self.op = None

    def fail(self, exc: BaseException) -> None:
        """The current op failed: tell peers, keep the streams consistent."""
        op = self.op
        if op is None:
            return
        for conn in self.conns.values():
            if conn.pay is not None:
                # stop writing into the caller's buffer; drain the rest
                conn.drain = len(conn.pay) - conn.pgot
                conn.pay, conn.on_pay = None, None
        if self.refs_out:
            self.unacked = self.refs_out - self.acked
            self.unacked_seq = op.seq
        kind = ("network" if isinstance(exc, DistNetworkError) else "timeout" if isinstance(exc, DistTimeoutError)
                else "mismatch" if isinstance(exc, DistMismatchError) else "error")
        body = F.pack_abort(kind, str(exc), getattr(exc, "rank", None), getattr(exc, "host", None))
        for conn in self.conns.values():
            if conn.dead is None:
                conn.out.append(memoryview(F.pack(F.ABORT, 0, 0, 0, 0, self.ghash, 0, op.seq, op.root, 0,
                                                  len(body))))
                conn.out.append(memoryview(body))
                try:
                    self._write(conn)
                except DistNetworkError:
                    pass
        self.op = None

    # ----------------------------------------------------------- the loop
    def step(self, expects=()) -> None:
        """Flush the frames queued with ``send()`` and satisfy ``expects`` (the op's deadline applies)."""
        self._waiting = expects
        conns = self.conns
        spin_end = 0.0
        while True:
            progressed = False
            lost = None
            for c in conns.values():
                if c.out:
                    try:
                        if self._write(c):
                            progressed = True
                    except DistNetworkError as err:
                        lost = lost or err  # still flush the other peers (e.g. their ACKs)
            if lost is not None:
                raise lost
            pending = False
            for e in expects:
                if not e.done:
                    if self._read(conns[e.peer], e):
                        progressed = True
                    if not e.done:
                        pending = True
            if not pending and not any(conns[p].out for p in self._dirty):
                # (frames left over from a failed op may still be queued to other
                # peers: they go out whenever those streams are next driven)
                self._dirty.clear()
                return
            if progressed:
                spin_end = 0.0
                continue
            if self.yield_s:
                # a short bounded spin before sleeping in poll: a peer's reply often
                # comes within microseconds; never long enough to starve a loaded core
                now = time.perf_counter()
                if not spin_end:
                    spin_end = now + self.spin_s
                    yield_end = spin_end + self.yield_s
                    continue
                if now < spin_end:
                    continue
                if now < yield_end:
                    _yield()
                    continue
            if self.external is not None:
                self.take_external()
            now = time.monotonic()
            left = self.deadline - now
            if now >= self._warn_at:  # (only here, where the loop is about to block)
                self._warn_stall(expects, now)
            if left <= 0:
                self._deadline_passed(expects, now)  # raises, or grants a grace for peers' notices
                continue
            poller = select.poll()
            if self._wake_r >= 0:
                poller.register(self._wake_r, _POLLIN)  # notify_lost
            wait = min(left, 1.0)
            sleeping = []
            woke = False
            for e in expects:
                if not e.done:
                    c = conns[e.peer]
                    if c.ring_in is not None:
                        if c.ring_in.sleep():  # data arrived while we set up: don't block
                            woke = True
                            break
                        sleeping.append(c)
                        wait = min(wait, _ring.MAX_SLEEP_S)
                    poller.register(c.fd, _POLLIN)
            if woke:
                for c in sleeping:
                    c.ring_in.wake()
                continue
            for c in conns.values():
                if c.out:
                    if c.ring_out is not None:  # ring full: retry soon; POLLIN shows its death
                        wait = min(wait, _ring.MAX_SLEEP_S)
                        poller.register(c.fd, _POLLIN)
                        continue
                    poller.register(c.fd, _POLLOUT | (_POLLIN if any(
                        e.peer == c.peer and not e.done for e in expects) else 0))
            ready = poller.poll(wait * 1000.0)
            for c in sleeping:
                c.ring_in.wake()
            for fd, _ev in ready:
                c = self._by_fd.get(fd)
                if c is None:  # the wake-up pipe: a loss told by another thread
                    try:
                        os.read(fd, 64)
                    except OSError:
                        pass
                    continue
                if c.ring_in is not None:
                    self._check_socket(c)
