"""The collective engine's transport (``_engine.Engine``, a mixin): writing queued
frames to a peer (its shared-memory ring, or the socket), reading one (header, then
payload into the step's destination, a scratch buffer or a view of the sender's
shared-memory segment or, for single-copy blocks, ``process_vm_readv``), and checking
each header against what this rank's call expects: a frame of an older, failed op is
drained, one of a newer op stays held for the next, anything else is a mismatch.
"""

from __future__ import annotations

import numpy as np

from .....runtime import DistBackendError, DistMismatchError
from ..wire import _cma
from ..wire import _frame as F
from ..failure._engine_loss import abort_reader

__all__ = ["Expect", "FrameIO"]

_EXACT_COUNT = {F.op_code(n) for n in ("all_reduce", "reduce", "broadcast")}
_ROOTED = {F.op_code(n) for n in ("reduce", "broadcast", "gather", "scatter")}
_DISCARD = np.empty(1 << 20, dtype=np.uint8)


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


class FrameIO:
    """Frames in and out of ``Engine``'s connections (it uses the engine's connections,
    op, step and loss handling)."""

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
            raise self._lost(conn, err) from None
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
            raise self._lost(conn, err) from None

    def _check_socket(self, conn) -> None:
        """A ring peer's socket is readable: doorbells (drop them) or its end (it died or closed)."""
        try:
            got = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as err:
            raise self._lost(conn, err) from None
        if got[:1] == b"D" and len(got) >= F.HDR_SIZE:  # not doorbells: a frame, from a peer
            self._socket_notice(conn, got)  # that could not build its rings (Mesh._abandon)
        if not got and not conn.ring_in.available():
            raise self._lost(conn, None)

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
            raise self._lost(conn, err) from None
        if n == 0:
            raise self._lost(conn, None)
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
                    raise self._lost(conn, f"corrupt stream: {err}") from None
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
        elif hdr[:32] != want[:32] or hdr[40:] != want[40:] or int.from_bytes(hdr[32:40], "little") > F.MAX_NBYTES:
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
                raise self._lost(conn, "corrupt stream: a memory reference from a peer this rank cannot read")
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
                raise self._lost(conn, f"cannot map its shared memory: {err}") from None
            self.refs_in.add(conn.peer)
            if exp.into is not None:
                np.copyto(exp.into, view)
                view = exp.into
            exp.result = view
            exp.done = True
            return
        self._start_payload(conn, exp, h.nbytes)
