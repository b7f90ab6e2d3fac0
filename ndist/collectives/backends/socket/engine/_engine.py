"""The Python engine's collective streams: one non-blocking stream per peer, driven
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

One class, ``CollectiveStreams``, owns the group's collective streams and everything that acts on
them: the op frame (``begin`` / ``finish`` / ``fail``), the loop (``step``), the links
opened on first use (``open``, ``Conns``), frames in and out and the header checks
(``_write`` / ``_read``). What it does on a failure is composed, each with its own state:
a lost peer (this engine's own finding, a peer's ``lost`` notice, or the backend's
point-to-point side) is ``losses`` (``failure/_engine_loss``), a passed deadline is
``stalls`` (``failure/_engine_stall``). Messages name global ranks.
"""

from __future__ import annotations

import logging
import os
import select
import struct
import time
from collections import deque

import numpy as np

from .....runtime import DistBackendError, DistMismatchError, DistNetworkError, DistTimeoutError
from ..wire import _frame as F
from ..wire import _ring
from ..wire import _cma
from ..failure._engine_loss import EngineLosses, abort_reader
from ..failure._engine_stall import EngineStalls

__all__ = ["CollectiveStreams", "OpInfo", "Expect"]

log = logging.getLogger("ndist.collectives.socket")
#: a frame header's byte count (offset 32): unpacked by struct, not int.from_bytes, whose result
#: for 8 zero bytes CPython 3.11 builds from an unset digit (0 x the digit: harmless, but
#: valgrind memcheck reports each use of it as an error in any job that runs this check)
_U64 = struct.Struct("<Q")

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
_EXACT_COUNT = {F.op_code(n) for n in ("all_reduce", "reduce", "broadcast")}
_ROOTED = {F.op_code(n) for n in ("reduce", "broadcast", "gather", "scatter")}
_DISCARD = np.empty(1 << 20, dtype=np.uint8)




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


class Expect:
    """One frame this rank waits for from ``peer`` in the current step."""

    __slots__ = ("peer", "kind", "step", "nbytes", "into", "result", "done")

    def __init__(self, peer, kind=F.DATA, step=0, nbytes=-1, into=None):
        self.peer = peer
        self.kind = kind
        self.step = step
        self.nbytes = nbytes
        self.into = into
        self.result = None
        self.done = False


class Conns(dict):
    """peer -> ``_Conn`` of the links open so far; a peer not here yet is linked on
    first use (``CollectiveStreams.open``): a step to it, or ``open_links``."""

    __slots__ = ("eng",)

    def __missing__(self, peer):
        return self.eng.open(peer)


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


class CollectiveStreams:
    """The Python engine's collective streams, one per peer, and all that acts on them (the
    module doc). Not an engine itself: the Python engine is ``Algorithms`` over this."""

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
        #: peer -> the generation of our segment it acknowledged reading (it has it mapped)
        self.mapped: dict = {}
        #: peers this op sent a reference into a generation they have not mapped yet
        self.first_refs: set = set()
        self._scratch: dict = {}
        self._dirty: set = set()  # peers with frames of this op still to flush
        self.closing = False
        #: pid of each same-host peer whose memory this rank may read (CMA)
        self.cma_pids: dict = {}
        self.spin_s = SPIN_S if spin else 0.0
        self.yield_s = YIELD_S
        self.waiting: list = []
        self.wait_warning = wait_warning_from_env()
        self._began = 0.0
        self._warn_at = float("inf")
        #: the op's timeout (``begin``)
        self.timeout = 0.0
        self.acking = False  # ``finish`` flushes its ACKs: a closed reader is not reported lost
        #: what this engine does when the group loses a member / when an op's deadline passes
        self.losses = EngineLosses(self)
        self.stalls = EngineStalls(self)

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
            if self.mapped.get(peer) != self.own_seg.gen:
                self.first_refs.add(peer)
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
        return sorted({g[e.peer] for e in self.waiting if not e.done}) if self.op is not None else []

    def global_ranks(self, peers) -> list:
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
        waiting = self.global_ranks(e.peer for e in expects if not e.done)
        unsent = self.global_ranks(c.peer for c in self.conns.values() if c.out)
        log.warning("group %r: %s has waited %.0f s; ranks not heard from: %s%s (it fails at the group "
                    "timeout, in %.0f s)", self.group_name, self.op.desc, now - self._began, waiting,
                    f"; ranks not reading: {unsent}" if unsent else "", max(0.0, self.deadline - now))

    # ----------------------------------------------------------- op frame
    def begin(self, op: OpInfo, timeout: float) -> None:
        if self.broken is not None:
            raise self.broken
        self.op = op
        if self.losses.external is not None:
            try:
                self.losses.take_external()
            finally:
                self.op = None
        if self.stalls.told_stalled:  # peers hold this rank's timeout notice: it goes on (_engine_stall)
            self.stalls.withdraw_stall(op)
        now = time.monotonic()
        self.deadline = now + timeout
        self.timeout = timeout
        self.stalls.in_grace = False
        self._began = now
        self._warn_at = now + self.wait_warning
        if self.refs_out:
            self.refs_out = set()
        if self.refs_in:
            self.refs_in = set()
        if self.acked:
            self.acked = set()
        if self.first_refs:
            self.first_refs = set()
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
        if not self.unacked or self.broken is not None or self.losses.external is not None:
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
        if self.first_refs:
            self._await_mapped()
        if self.refs_out:
            self.unacked = self.refs_out - self.acked
            self.unacked_seq = self.op.seq
        self.op = None

    def _await_mapped(self) -> None:
        """Return only once every peer this op first sent a reference into a generation of
        our segment has acknowledged reading it. A peer maps a generation through
        ``/proc/<our pid>/fd`` when it reads the first reference to it; had we returned and
        died before that, the data it needs would have gone with our descriptor (its op
        failing, naming us, after ours succeeded). Once mapped, its mapping keeps the memory
        alive whatever happens to us. A round trip once per generation and peer; the ACKs we
        owe were sent first, so two ranks waiting on each other both get theirs. The op's
        deadline applies (a reader that never comes times it out, as a reader of a large
        message over TCP would); a reader that is gone only fails the ops after this one."""
        wait = [Expect(p, kind=-1) for p in sorted(self.first_refs - self.acked)]
        if not wait:
            return
        try:
            self.step(wait)
        except DistNetworkError as err:
            log.debug("a reader of our segment is gone before acknowledging it: %s", err)
            self._dirty.clear()

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
        self.waiting = expects
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
            if self.losses.external is not None:
                self.losses.take_external()
            now = time.monotonic()
            left = self.deadline - now
            if now >= self._warn_at:  # (only here, where the loop is about to block)
                self._warn_stall(expects, now)
            if left <= 0:
                self.stalls.deadline_passed(expects, now)  # raises, or grants a grace for peers' notices
                continue
            poller = select.poll()
            if self.losses.wake_r >= 0:
                poller.register(self.losses.wake_r, _POLLIN)  # notify_lost
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

    # ----------------------------------------------------------- links (opened on first use)
    def open(self, peer: int):
        """Open the collective link to ``peer`` (its first use; ``Conns``). A peer known
        dead fails it at once, as a lost connection does: the group is broken."""
        if self.opener is None or peer == self.rank or not 0 <= peer < self.size:
            raise KeyError(peer)
        if self.broken is not None:
            raise self.broken
        deadline = self.deadline if self.op is not None else time.monotonic() + 60.0
        try:
            sock, facts = self.opener(peer, deadline)
        except DistNetworkError as err:
            if err.rank is not None and self.broken is None and getattr(err, "dead", False):
                self.broken = err
                if self.op is not None:
                    self.losses.announce(err)
                self.losses.told_backend(err, str(err).split(": ", 1)[-1])
            raise
        conn = self.new_conn(peer, self.hosts.get(peer, "?"), sock, self.granks[peer])
        try:
            if self.on_link is not None:
                self.on_link(conn, facts)
        except BaseException:
            sock.close()
            raise
        dict.__setitem__(self.conns, peer, conn)
        self._by_fd[conn.fd] = conn
        return conn

    def open_links(self, peers) -> None:
        """Open the links to every peer in ``peers`` not linked yet (an op that talks to
        all of them, and must agree per pair on their paths before its first frame)."""
        conns = self.conns
        if len(conns) == self.size - 1:
            return
        for p in peers:
            if p not in conns:
                self.open(p)

    # ----------------------------------------------------------- frames in and out
    def tell_peers(self, body: bytes, seq: int, root: int = -1) -> None:
        """Send an ABORT frame with ``body`` to every peer whose connection is alive. Best
        effort, never blocks: a peer that is gone too is already recorded by ``EngineLosses.lost``."""
        head = F.pack(F.ABORT, 0, 0, 0, 0, self.ghash, 0, seq, root, 0, len(body))
        for conn in self.conns.values():
            if conn.dead is None:
                conn.out.append(memoryview(head))
                conn.out.append(memoryview(body))
                try:
                    self._write(conn)
                except DistNetworkError:
                    pass

    def _write(self, conn) -> bool:
        if not conn.out:
            return False
        if conn.dead is not None:
            raise conn.dead
        ring = conn.ring_out
        if ring is not None:
            n, asleep = ring.write(conn.out)
            if asleep:
                self._doorbell(conn)
            return n > 0
        try:
            sent = conn.sock.sendmsg(list(conn.out)[:64])
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as err:
            raise self.losses.lost(conn, err) from None
        out = conn.out
        while sent:
            head = out[0]
            if sent >= len(head):
                sent -= len(head)
                out.popleft()
            else:
                out[0] = head[sent:]
                sent = 0
        return True

    def _doorbell(self, conn) -> None:
        """Wake a ring peer that was asleep when this rank wrote. Only a hint: the data is in
        the ring. A peer that has closed its end meanwhile may have woken on its own, read it
        and left (its op done); one that left without reading it is seen by the reads."""
        try:
            conn.sock.send(b"\x01")
        except (BlockingIOError, InterruptedError, BrokenPipeError, ConnectionResetError):
            pass  # doorbells already queued (the reader wakes anyway), or the reader left
        except OSError as err:
            raise self.losses.lost(conn, err) from None

    def _check_socket(self, conn) -> None:
        """A ring peer's socket is readable: doorbells (drop them) or its end (it died or closed)."""
        try:
            got = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as err:
            raise self.losses.lost(conn, err) from None
        if got[:1] == b"D" and len(got) >= F.HDR_SIZE:  # not doorbells: a frame, from a peer
            self._socket_notice(conn, got)  # that could not build its rings (Mesh._abandon)
        if not got and not conn.ring_in.available():
            raise self.losses.lost(conn, None)

    def _socket_notice(self, conn, got: bytes) -> None:
        try:
            h = F.unpack(got[:F.HDR_SIZE])
        except F.FrameError:
            return
        if h.kind == F.ABORT and h.group == self.ghash and len(got) >= F.HDR_SIZE + h.nbytes:
            abort_reader(self, h, Expect(conn.peer))(conn, memoryview(got[F.HDR_SIZE:F.HDR_SIZE + h.nbytes]))

    def _recv(self, conn, view) -> int:
        ring = conn.ring_in
        if ring is not None:
            return ring.read_into(view) or -1
        try:
            n = conn.sock.recv_into(view)
        except (BlockingIOError, InterruptedError):
            return -1
        except OSError as err:
            raise self.losses.lost(conn, err) from None
        if n == 0:
            raise self.losses.lost(conn, None)
        return n

    def _read(self, conn, exp: Expect) -> bool:
        """Read what is available from ``conn`` towards ``exp``; True on progress."""
        progressed = False
        while not exp.done:
            if conn.drain:
                n = self._recv(conn, memoryview(_DISCARD)[: min(conn.drain, _DISCARD.nbytes)])
                if n < 0:
                    return progressed
                conn.drain -= n
                progressed = True
                continue
            if conn.pay is not None:
                n = self._recv(conn, conn.pay[conn.pgot:])
                if n < 0:
                    return progressed
                conn.pgot += n
                progressed = True
                if conn.pgot == len(conn.pay):
                    cb, view = conn.on_pay, conn.pay
                    conn.pay, conn.on_pay = None, None
                    if cb.__class__ is Expect:
                        cb.done = True
                    elif cb is not None:
                        cb(conn, view)
                continue
            if conn.held is not None:
                h, conn.held = conn.held, None
                self._dispatch(conn, h, exp)
                if conn.held is not None:
                    return progressed
                continue
            n = self._recv(conn, conn.hview[conn.hgot:] if conn.hgot else conn.hview)
            if n < 0:
                return progressed
            progressed = True
            conn.hgot += n
            if conn.hgot == F.HDR_SIZE:
                conn.hgot = 0
                if self._expected_data(conn, exp):
                    continue
                try:
                    h = F.unpack(conn.hdr)
                    if h.group != self.ghash:
                        raise F.FrameError(f"frame of another group (hash {h.group:#x})")
                except F.FrameError as err:
                    raise self.losses.lost(conn, f"corrupt stream: {err}") from None
                self._dispatch(conn, h, exp)
        return progressed

    def _expected_data(self, conn, exp: Expect) -> bool:
        """Fast path: the header just read is exactly the inline DATA frame ``exp``
        waits for (compared byte for byte with the header this rank would send for
        its own call, so every check of ``_dispatch`` holds); start its payload."""
        nb = exp.nbytes
        op = self.op
        if nb < 0 or exp.kind != F.DATA or op is None:
            return False
        want = self.frame(F.DATA, exp.step, nb)
        hdr = conn.hdr
        if op.code in _EXACT_COUNT:
            if hdr != want:
                return False
        elif hdr[:32] != want[:32] or hdr[40:] != want[40:] or _U64.unpack_from(hdr, 32)[0] > F.MAX_NBYTES:
            return False  # (the sender's count may differ: it only names its call in errors)
        self._start_payload(conn, exp, nb)
        return True

    def _start_payload(self, conn, exp: Expect, nbytes: int) -> None:
        """An inline DATA frame for ``exp`` was accepted: read its payload into
        ``exp.into`` (or this peer's scratch buffer)."""
        dest = exp.into if exp.into is not None else self.scratch(conn.peer, nbytes)
        exp.result = dest
        if nbytes == 0:
            exp.done = True
            return
        conn.pay = memoryview(dest).cast("B")
        conn.pgot = 0
        conn.on_pay = exp

    def _dispatch(self, conn, h, exp: Expect) -> None:
        op = self.op
        cur = op.seq if op is not None else None
        if h.kind == F.ABORT:
            conn.pay = memoryview(bytearray(h.nbytes))
            conn.pgot = 0
            conn.on_pay = abort_reader(self, h, exp)
            if h.nbytes == 0:
                conn.pay, cb = None, conn.on_pay
                conn.on_pay = None
                cb(conn, memoryview(b""))
            return
        if conn.stall is not None and h.seq >= conn.stall[0]:
            conn.stall = None  # sent after its notice: the peer goes on (the stream keeps order)
        if h.kind == F.ACK:
            self.mapped[conn.peer] = self.own_seg.gen  # (the segment grows only once every ACK is in)
            if h.seq == self.unacked_seq:
                self.unacked.discard(conn.peer)
            elif h.seq == cur:
                self.acked.add(conn.peer)
            if exp.kind == -1 and conn.peer not in self.unacked:
                exp.done = True
            return
        if cur is None or h.seq < cur:
            # a frame of an op that failed here: drain it
            if not h.flags:
                conn.drain = h.nbytes
            return
        if h.seq > cur or exp.kind == -1:
            conn.held = h
            if exp.kind == -1:
                self.unacked.discard(conn.peer)
                exp.done = True
                return
            raise DistMismatchError(
                f"collective mismatch in group {self.group_name!r}: {op.desc}; "
                f"{self._describe_peer(conn, h)} "
                f"(rank {conn.grank} did not take part in #{cur})")
        # same op number: must be what we expect
        bad = (h.op != op.code or h.dtype != op.dtype or (h.op in _ROOTED and h.root != op.root)
               or (h.op in _EXACT_COUNT and h.count != op.count) or h.kind != exp.kind or h.redop != op.redop)
        if not bad and exp.nbytes >= 0 and h.nbytes != exp.nbytes:
            if not h.flags:
                conn.drain = h.nbytes
            raise DistMismatchError(
                f"collective mismatch in group {self.group_name!r}: {op.desc} expects {exp.nbytes} bytes "
                f"from rank {conn.grank}; {self._describe_peer(conn, h)} sends "
                f"{h.nbytes} bytes")
        if bad or h.step != exp.step:
            if not h.flags and h.kind == F.DATA:
                conn.drain = h.nbytes
            raise DistMismatchError(f"collective mismatch in group {self.group_name!r}: {op.desc}; "
                                    f"{self._describe_peer(conn, h)}")
        if h.flags & F.F_CMA:
            pid = self.cma_pids.get(conn.peer)
            if pid is None:
                raise self.losses.lost(conn, "corrupt stream: a memory reference from a peer this rank cannot read")
            dest = exp.into if exp.into is not None else self.scratch(conn.peer, h.nbytes)
            try:
                _cma.read_into(pid, h.offset, dest.reshape(-1).view(np.uint8))
            except OSError as err:
                # the frame is consumed and the stream intact: fail this op only (a
                # sender that failed meanwhile may have freed its buffer; a dead one
                # shows up as a lost connection on the next read)
                raise DistBackendError(
                    f"group {self.group_name!r}: {op.desc}: cannot read rank {conn.grank}'s buffer "
                    f"({conn.host}): {err}") from None
            exp.result = dest
            exp.done = True
            return
        if h.flags & F.F_SHM:
            try:
                view = self.peer_segs.view(conn.peer, self.prefixes[conn.peer], h.shm_gen, h.offset, h.nbytes)
            except (OSError, ValueError) as err:
                raise self.losses.lost(conn, f"cannot map its shared memory: {err}") from None
            self.refs_in.add(conn.peer)
            if exp.into is not None:
                np.copyto(exp.into, view)
                view = exp.into
            exp.result = view
            exp.done = True
            return
        self._start_payload(conn, exp, h.nbytes)
