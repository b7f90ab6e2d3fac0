"""Point-to-point messages: tagged sends, receives from one rank or any.

Sends go out on this rank's own connection to the destination (one ordered
stream per direction, so messages between two ranks with one tag never
overtake each other). One reader thread per backend drains every incoming
stream as soon as data arrives: into the buffer of a matching posted receive
(zero copy), else into an unexpected-message buffer that a later ``recv``
copies from. The sender therefore never waits for the receiver to post, and
``isend``/``irecv`` may be issued in any order on either side. A receive
checks the dtype and element count the sender's frame names, as collectives
check each other's frames: a mismatch fails the receive (DistMismatchError
naming the sender) and writes nothing into its buffer.

Delivery. A send that returned (or whose Work completed) is delivered even
if the sender then destroys the group or exits: before its connections
close (``flush``: backend close, and interpreter exit for backends still
open), a rank lets its queued sends go out, writes a ``bye`` frame on every
point-to-point stream and waits, up to the group timeout, until each peer it
has a stream to confirms (ACK) that it read everything before the bye. A
peer's end of stream after its bye is a departure, not a failure: receives
waiting on that peer fail with DistNetworkError saying it left.

Failure. An end of stream without a bye, or a connection error, is a lost
peer: the group's point-to-point traffic is broken. Every posted receive
fails with DistNetworkError naming the lost rank and its host, later sends
and receives fail with it too, and the rank tells every peer it has a stream
to (ABORT of kind ``lost``, after any message it sent them) which does the
same once: a survivor waiting on a live rank fails at once, not at the
group timeout.

Stalls. A receive from one rank whose deadline (the group timeout) passes tells
the process's groups that this rank waits on it (``on_stalled``: ``_stalls``;
here, ABORT ``stalled`` on every stream) and gives such notices a grace of
min(1 s, 10 % of the timeout): when the rank it waits on told it is itself stuck
waiting on others (a stopped rank, in a collective or a receive), the receive
fails naming those, the root cause. A notice is dropped at that peer's next
message, and counts only once the receive's own deadline has passed.
"""

from __future__ import annotations

import atexit
import logging
import os
import selectors
import socket
import threading
import time
import weakref

import numpy as np

from .....runtime import DistMismatchError, DistNetworkError, DistTimeoutError, Work
from .....runtime import _net
from ..wire import _frame as F
from ..failure import _stalls
from ..failure._p2p_loss import P2PLosses
from ..failure._p2p_stall import P2PStalls
from ._stream import Stream as _Stream
from ._stream import recv_payload as _recv_payload
from ._stream import send_ctl as _send_ctl
from ..wire._tcp import P2P_CH

__all__ = ["P2P"]

log = logging.getLogger("ndist.collectives.socket")

#: a relayed notice is written within this long (a peer that does not read in that
#: time learns of the loss by other means: its own streams, or its timeout)
_RELAY_S = 5.0

_OP_SEND = F.op_code("send")
_OP_BYE = F.op_code("bye")


class _Recv:
    __slots__ = ("buf", "src", "tag", "work", "deadline", "due", "grace")

    def __init__(self, buf, src, tag, work, deadline):
        self.buf, self.src, self.tag, self.work, self.deadline = buf, src, tag, work, deadline
        self.due = deadline  # the group timeout's deadline (``deadline`` may add a grace)
        self.grace = False  # its deadline passed: waiting for the peer's timeout notice

    def matches(self, src, tag):
        return (self.src is None or self.src == src) and self.tag == tag


class P2P:
    def __init__(self, rank: int, size: int, group_name: str, timeout: float, mesh_ref, executor=None,
                 granks=None, on_loss=None) -> None:
        self.rank = rank
        self.size = size
        #: global rank of each group rank: every message and ``.rank`` names global ranks
        self.granks = tuple(granks) if granks is not None else tuple(range(size))
        self.gindex = {g: i for i, g in enumerate(self.granks)}
        self.group_name = group_name
        self.ghash = F.group_hash(group_name)
        self.timeout = timeout
        self.mesh = mesh_ref  # callable returning the Mesh
        self._executor = executor  # where sends queue (drained before the byes)
        self.lock = threading.Lock()
        self._cond = threading.Condition(self.lock)
        self.posted: list[_Recv] = []
        self._unexpected: list[tuple[int, int, np.ndarray, int, int]] = []  # src, tag, data, dtype, count
        self.streams: dict[int, _Stream] = {}  # id(sock) -> stream
        self._new: list[_Stream] = []
        self.dead: dict[int, DistNetworkError] = {}  # peers lost (died)
        self.gone: dict[int, DistNetworkError] = {}  # peers that left the group (bye, then end)
        self.leaving: set[int] = set()  # peers that said bye on some stream
        self.broken: DistNetworkError | None = None
        self._acks: set[int] = set()  # outgoing streams whose ACK of our bye is awaited
        self._dialing: set[int] = set()  # peers being dialled to watch them
        self._flushing = False  # leaving: queued sends still go out
        self.byes = False  # leaving, no more sends: every stream gets a bye, new ones at once
        self._left_group = False  # flushed: streams now end because this rank closes them
        self._rd, self._wr = os.pipe()
        os.set_blocking(self._wr, False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._rd, selectors.EVENT_READ, None)
        self.closed = False
        #: what this side does when the group loses a member / when a wait passes its deadline
        self.losses = P2PLosses(self, on_loss)
        self.stalls = P2PStalls(self)
        self._thread = threading.Thread(target=self._loop, name=f"ndist-p2p-{group_name}-{rank}", daemon=True)
        self._thread.start()
        self._pid = os.getpid()
        _LIVE.add(self)

    def host(self, peer) -> str:
        try:
            return self.mesh().host_of(peer)
        except Exception:  # noqa: BLE001 - the mesh is not built yet, or gone
            return "?"

    # ------------------------------------------------------------- sending

    def tell(self, frame: bytes, skip: set, what: str) -> None:
        """Write ``frame`` to each live peer with a stream (ours when there is one), on
        a thread of its own: never blocks the caller."""
        with self.lock:
            targets: dict[int, _Stream] = {}
            for st in self.streams.values():
                if st.ended or st.peer in skip or st.peer in self.dead or st.peer in self.gone:
                    continue
                if st.peer not in targets or (st.outgoing and not targets[st.peer].outgoing):
                    targets[st.peer] = st
        if not targets:
            return

        def tell() -> None:
            deadline = time.monotonic() + _RELAY_S
            for st in targets.values():
                if st.wlock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    try:
                        _send_ctl(st.sock, frame, deadline)
                    finally:
                        st.wlock.release()
            log.debug("rank %d told ranks %s: %s", self.rank, sorted(targets), what)

        threading.Thread(target=tell, name=f"ndist-p2p-relay-{self.group_name}-{self.rank}", daemon=True).start()

    def select_wait(self) -> float:
        """How long the reader may sleep: at most 0.5 s, and not past a receive's deadline."""
        with self.lock:
            if not self.posted:
                return 0.5
            first = min(r.deadline for r in self.posted)
        return min(0.5, max(0.005, first - time.monotonic()))

    def send(self, buf: np.ndarray, dst: int, tag: int) -> None:
        data = buf.reshape(-1).view(np.uint8)
        if dst == self.rank:
            self._deliver_local(buf, data, tag)
            return
        err = self.dead.get(dst) or self.broken or self.gone.get(dst)
        if err is not None:
            raise err
        try:
            sock = self.mesh().p2p_socket(dst, time.monotonic() + self.timeout)
        except DistTimeoutError:
            raise
        except Exception as err:  # noqa: BLE001 - refused, reset, failed handshake: unreachable
            if _stalls.timed_out(err):  # alive but silent (stopped, say): a timeout, not a loss
                raise self.stalls.send_timeout(dst, tag, err) from None
            raise self.losses.unreachable(dst, err) from None
        st = self._watch(dst, sock, True)
        hdr = F.pack(F.P2P, _OP_SEND, F.dtype_code(buf.dtype), 0, 0, self.ghash, 0, 0, tag, buf.size, data.nbytes)
        with st.wlock:
            try:
                _net.send_all(sock, hdr, data)
            except OSError as err:
                raise self.losses.unreachable(dst, err) from None

    def _deliver_local(self, buf, data, tag) -> None:
        dcode = F.dtype_code(buf.dtype)
        with self.lock:
            for i, r in enumerate(self.posted):
                if r.matches(self.rank, tag):
                    del self.posted[i]
                    break
            else:
                self._unexpected.append((self.rank, tag, data.copy(), dcode, buf.size))
                return
        self._fill(r, self.rank, data, dcode, buf.size)

    def _mismatch(self, r: _Recv, src: int, dcode: int, count: int, nbytes: int) -> DistMismatchError | None:
        buf = r.buf
        if buf.nbytes == nbytes and buf.size == count and F.dtype_code(buf.dtype) == dcode:
            return None
        g = self.granks
        return DistMismatchError(
            f"group {self.group_name!r}: recv on rank {g[self.rank]} from "
            f"{'any rank' if r.src is None else f'rank {g[r.src]}'} (tag {r.tag}) expects "
            f"{F.dtype_name(F.dtype_code(buf.dtype))}[{buf.size}] ({buf.nbytes} bytes); rank {g[src]} sent "
            f"{F.dtype_name(dcode)}[{count}] ({nbytes} bytes; host {self.host(src)})")

    def _fill(self, r: _Recv, src: int, data: np.ndarray, dcode: int, count: int) -> None:
        bad = self._mismatch(r, src, dcode, count, data.nbytes)
        if bad is not None:
            r.work.fail(bad)
            return
        np.copyto(r.buf.reshape(-1).view(np.uint8), data)
        r.work.outputs = [src]
        r.work.complete()

    # ------------------------------------------------------------- receiving
    def post(self, buf: np.ndarray, src: int | None, tag: int, work: Work) -> None:
        err = None
        with self.lock:
            for i, (s, t, data, dcode, count) in enumerate(self._unexpected):
                if (src is None or src == s) and t == tag:
                    del self._unexpected[i]
                    break
            else:
                data = None
                # what arrived before a failure is still delivered (above); nothing more will
                err = (None if src is None else self.dead.get(src)) or self.broken or (
                    None if src is None else self.gone.get(src))
                if err is None:
                    self.posted.append(_Recv(buf, src, tag, work, time.monotonic() + self.timeout))
        if data is not None:
            self._fill(_Recv(buf, src, tag, work, 0), s, data, dcode, count)
            return
        if err is not None:
            work.fail(err)
            return
        # watch the peers we wait on, so that their death fails this receive: a peer
        # we have no stream with yet is dialled, in the background (the receive may
        # complete meanwhile, and a peer that sends and leaves closes its listener)
        for p in ([src] if src is not None else range(self.size)):
            if p != self.rank and self._needs_watch(p):
                with self.lock:
                    if p in self._dialing:
                        continue
                    self._dialing.add(p)
                threading.Thread(target=self._dial, args=(p,), daemon=True,
                                 name=f"ndist-p2p-watch-{self.group_name}-{self.rank}").start()

    def _needs_watch(self, peer: int) -> bool:
        """No stream shows ``peer``'s end yet (and it has not left or died)."""
        with self.lock:
            if peer in self.leaving or peer in self.dead or self.closed:
                return False
            return not any(st.peer == peer and not st.ended for st in self.streams.values())

    def _dial(self, peer: int) -> None:
        """Open a stream to ``peer`` only to see its end. Short attempts, outside the
        mesh's lock (sends to other peers never wait on this), given up as soon as
        no receive waits on ``peer`` any more or it has left."""
        end = time.monotonic() + self.timeout
        err = None
        try:
            while self._waits_on(peer) and self._needs_watch(peer):
                now = time.monotonic()
                if now >= end:
                    if not _stalls.timed_out(err):  # (a silent peer: the receive's own timeout names it)
                        self.losses.unreachable(peer, err)
                    return
                mesh = self.mesh()
                try:
                    sock = mesh.connect(peer, P2P_CH, min(end, now + 1.0))
                except DistTimeoutError as e:  # the peer never published its address
                    # lost only when it is known dead; a live one that never published (stopped
                    # before its group's set-up, say) is named by the receive's own timeout
                    if not self.closed and self._waits_on(peer) and mesh.is_dead(peer):
                        self.losses.unreachable(peer, e)
                    return
                except Exception as e:  # noqa: BLE001 - refused, reset: retried until the deadline
                    err = e
                    if isinstance(e, DistNetworkError) and mesh.is_dead(peer):  # it will never answer
                        self.losses.unreachable(peer, e)
                        return
                    continue
                mesh.keep_p2p(peer, sock)  # our sends to it may use it too (one ordered stream)
                self._watch(peer, sock, True)
                return
        finally:
            with self.lock:
                self._dialing.discard(peer)

    def _waits_on(self, peer: int) -> bool:
        with self.lock:
            return not self.closed and any(r.src == peer or r.src is None for r in self.posted)

    def incoming(self, peer: int, sock: socket.socket) -> None:
        """Called by the listener for a peer's new point-to-point connection."""
        self._watch(peer, sock, False)

    def _watch(self, peer: int, sock: socket.socket, outgoing: bool) -> _Stream:
        with self.lock:
            st = self.streams.get(id(sock))
            if st is not None and st.sock is sock:
                return st
            st = _Stream(peer, sock, outgoing)
            closed = self.closed
            if not closed:
                self.streams[id(sock)] = st
                self._new.append(st)
            # a stream made while this rank is leaving: a peer's (it carries no data of
            # ours), or after the last send a dial to watch a peer
            late = self.byes or (self._flushing and not outgoing)
        if closed:  # too late to read it: the peer sees this rank leave
            self._say_bye(st, time.monotonic() + 1.0)
            sock.close()
            return st
        if late:  # a peer connected while this rank is leaving: tell it at once
            self._say_bye(st, time.monotonic() + 1.0)
        try:
            os.write(self._wr, b"x")
        except OSError:
            pass
        return st

    # ------------------------------------------------------------- reader
    def _loop(self) -> None:
        while not self.closed:
            with self.lock:
                new, self._new = self._new, []
            for st in new:
                try:
                    self._sel.register(st.sock, selectors.EVENT_READ, st)
                except (ValueError, KeyError, OSError) as err:
                    self._end(st, err)
            try:
                events = self._sel.select(timeout=self.select_wait())
            except OSError:
                return
            for key, _ in events:
                if key.data is None:
                    try:
                        os.read(self._rd, 4096)
                    except OSError:
                        pass
                    continue
                try:
                    self._read_frame(key.data)
                except Exception as err:  # noqa: BLE001 - OSError, FrameError, MemoryError: the stream ended
                    self._end(key.data, err)
            self.stalls.expire()

    def _read_frame(self, st: _Stream) -> None:
        sock, peer = st.sock, st.peer
        h = F.unpack(_net.recv_exact(sock, F.HDR_SIZE))
        if h.group != self.ghash:
            raise F.FrameError(f"frame of another group (hash {h.group:#x}) on a point-to-point stream")
        if h.kind == F.P2P and h.op == _OP_SEND and not st.outgoing and not st.bye_in:
            self._read_message(peer, sock, h)
        elif h.kind == F.P2P and h.op == _OP_BYE:
            self._on_bye(st)
        elif h.kind == F.ACK and h.op == _OP_BYE and st.outgoing:
            with self._cond:
                self._acks.discard(id(st))
                self._cond.notify_all()
        elif h.kind == F.ABORT:
            self.losses.on_notice(st.peer, F.unpack_abort(_net.recv_exact(sock, h.nbytes)))
        else:
            raise F.FrameError(f"unexpected frame (kind {h.kind}, op {h.op}) on a point-to-point stream")
        st.frames += 1

    def _read_message(self, peer: int, sock: socket.socket, h) -> None:
        with self.lock:
            if self.stalls.notes:
                self.stalls.notes.pop(peer, None)  # it goes on: its timeout notice is stale
            for i, r in enumerate(self.posted):
                if r.matches(peer, h.root):
                    del self.posted[i]
                    break
            else:
                r = None
        if r is not None and self._mismatch(r, peer, h.dtype, h.count, h.nbytes) is None:
            if h.nbytes:
                _net.recv_into_exact(sock, memoryview(r.buf.reshape(-1).view(np.uint8)))
            r.work.outputs = [peer]
            r.work.complete()
            return
        data = _recv_payload(sock, h.nbytes)
        if r is None:
            # a receive may have been posted while the payload was arriving
            with self.lock:
                for i, r in enumerate(self.posted):
                    if r.matches(peer, h.root):
                        del self.posted[i]
                        break
                else:
                    r = None
                    self._unexpected.append((peer, h.root, data, h.dtype, h.count))
        if r is not None:
            self._fill(r, peer, data, h.dtype, h.count)  # copies, or fails the receive on a mismatch

    def _on_bye(self, st: _Stream) -> None:
        """The peer is leaving. On its stream to us, the bye follows everything it sent
        there: acknowledge, so it may close. Receives waiting on it fail only when its
        streams end (it closes once every stream it sent on was acknowledged; it may
        have two to us, one opened to send and one to watch us)."""
        st.bye_in = True
        with self.lock:
            self.leaving.add(st.peer)
        if st.outgoing:
            return
        if st.wlock.acquire(timeout=1.0):
            try:
                _send_ctl(st.sock, F.pack(F.ACK, _OP_BYE, 0, 0, 0, self.ghash, 0, 0, -1, 0, 0),
                          time.monotonic() + 1.0)
            finally:
                st.wlock.release()

    def _end(self, st: _Stream, err) -> None:
        """``st`` ended (end of stream, connection error, corrupt frame)."""
        try:
            self._sel.unregister(st.sock)
        except (KeyError, ValueError):
            pass
        try:
            st.sock.shutdown(socket.SHUT_RDWR)  # a corrupt stream is not read again
        except OSError:
            pass
        with self._cond:
            st.ended = True
            self._acks.discard(id(st))
            self._cond.notify_all()
        if self.closed or self._left_group:
            return  # (this rank's own close ends its streams)
        log.debug("rank %d: %s stream with rank %d ended (bye %s): %s", self.rank,
                  "outgoing" if st.outgoing else "incoming", st.peer, st.bye_in, err)
        if st.bye_in or st.peer in self.leaving:
            self._left(st.peer)  # (a peer that said bye on one stream is leaving: all its streams end)
        else:
            # Peers and the group's collectives are told too, but only of a loss this rank
            # can vouch for: a stream it dialled, or one that carried the peer's frames, or
            # a peer known dead. A corrupt or forged stream (any holder of the job secret
            # can open one, claiming a rank) fails this rank's receives only.
            vouched = not isinstance(err, F.FrameError) and (st.outgoing or st.frames > 0 or self.losses.known_dead(st.peer))
            self.losses.peer_lost(st.peer, err, vouched=vouched)

    # ------------------------------------------------------------- departures and failures
    def _left(self, peer: int) -> None:
        """``peer`` left the group (destroy or exit) and will send nothing more."""
        host, g = self.host(peer), self.granks
        with self.lock:
            self.leaving.add(peer)
            self.gone.setdefault(peer, DistNetworkError(
                f"group {self.group_name!r}: rank {g[peer]} ({host}) has left the group "
                f"(destroy_process_group() or exit)", rank=g[peer], host=host))
            failed = [r for r in self.posted if r.src == peer]
            self.posted = [r for r in self.posted if r.src != peer]
        for r in failed:
            r.work.fail(DistNetworkError(
                f"group {self.group_name!r}: recv on rank {g[self.rank]} from rank {g[peer]} (tag {r.tag}): rank "
                f"{g[peer]} ({host}) left the group (destroy_process_group() or exit) without sending a matching "
                f"message", rank=g[peer], host=host))

    # ------------------------------------------------------------- leaving
    def _say_bye(self, st: _Stream, deadline: float) -> bool:
        """Write our bye on ``st`` once; True when it is written (now or before)."""
        if not st.wlock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return False
        try:
            if not st.bye_out and not st.ended:
                st.bye_out = True
                st.bye_ok = _send_ctl(st.sock, F.pack(F.P2P, _OP_BYE, 0, 0, 0, self.ghash, 0, 0, -1, 0, 0),
                                      deadline)
            return st.bye_ok
        finally:
            st.wlock.release()

    def flush(self, timeout: float | None = None) -> bool:
        """Before this rank's streams close: let queued sends go out, say bye on
        every stream and wait (up to ``timeout``, default the group timeout) until
        each peer we send to confirmed it read everything. True when all did."""
        with self.lock:
            if self._flushing or self.closed:
                return True
            self._flushing = True
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        if self._executor is not None and not self._executor.drain(deadline):
            log.warning("group %r rank %d: leaving with point-to-point sends still queued", self.group_name,
                        self.rank)
        with self.lock:
            self.byes = True
            streams = [st for st in self.streams.values() if not st.ended]
            self._acks = {id(st) for st in streams if st.outgoing}
        for st in streams:
            if not self._say_bye(st, deadline) and st.outgoing:
                with self.lock:
                    self._acks.discard(id(st))
        with self._cond:
            while self._acks and self._thread.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.5))
            missing = sorted(st.peer for st in streams if id(st) in self._acks)
        self._left_group = True
        if missing:
            log.warning("group %r rank %d: leaving before ranks %s confirmed they read its point-to-point "
                        "messages (%g s)", self.group_name, self.rank, missing, self.timeout)
        return not missing

    def close(self) -> None:
        with self.lock:
            self.closed = True
        _LIVE.discard(self)
        try:
            os.write(self._wr, b"x")
        except OSError:
            pass
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        with self.lock:
            pending, self.posted = self.posted, []
            streams = list(self.streams.values())
        for r in pending:
            r.work.fail(DistNetworkError(f"group {self.group_name!r}: backend closed before the receive "
                                          f"completed", rank=None if r.src is None else self.granks[r.src]))
        self._sel.close()
        for st in streams:
            try:
                st.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            st.sock.close()
        for fd in (self._rd, self._wr):
            try:
                os.close(fd)
            except OSError:
                pass


#: backends still open: the interpreter's exit flushes them (a rank need not
#: call destroy_process_group, as in torch)
_LIVE: "weakref.WeakSet[P2P]" = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    for p2p in list(_LIVE):
        if p2p._pid != os.getpid():
            continue  # a forked child's copy: its sockets are the parent's
        try:
            p2p.flush()
        except Exception as err:  # noqa: BLE001 - exiting: never raise from here
            log.debug("flushing point-to-point streams at exit failed: %s", err)
