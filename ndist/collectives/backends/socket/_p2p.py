"""Point-to-point messages: tagged sends, receives from one rank or any.

Sends go out on this rank's own connection to the destination (one ordered
stream per direction, so messages between two ranks with one tag never
overtake each other). One reader thread per backend drains every incoming
stream as soon as data arrives: into the buffer of a matching posted receive
(zero copy), else into an unexpected-message buffer that a later ``recv``
copies from. The sender therefore never waits for the receiver to post, and
``isend``/``irecv`` may be issued in any order on either side.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import threading
import time

import numpy as np

from ....runtime import DistMismatchError, DistNetworkError, DistTimeoutError, Work
from ....runtime import _net
from . import _frame as F

__all__ = ["P2P"]

log = logging.getLogger("ndist.collectives.socket")


class _Recv:
    __slots__ = ("buf", "src", "tag", "work", "deadline")

    def __init__(self, buf, src, tag, work, deadline):
        self.buf, self.src, self.tag, self.work, self.deadline = buf, src, tag, work, deadline

    def matches(self, src, tag):
        return (self.src is None or self.src == src) and self.tag == tag


class P2P:
    def __init__(self, rank: int, size: int, group_name: str, timeout: float, mesh_ref) -> None:
        self.rank = rank
        self.size = size
        self.group_name = group_name
        self.ghash = F.group_hash(group_name)
        self.timeout = timeout
        self._mesh = mesh_ref  # callable returning the Mesh
        self._lock = threading.Lock()
        self._posted: list[_Recv] = []
        self._unexpected: list[tuple[int, int, np.ndarray]] = []
        self._dead: dict[int, DistNetworkError] = {}
        self._new: list[tuple[int, socket.socket]] = []
        self._send_locks: dict[int, threading.Lock] = {}
        self._socks: list[socket.socket] = []
        self._rd, self._wr = os.pipe()
        os.set_blocking(self._wr, False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._rd, selectors.EVENT_READ, None)
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"ndist-p2p-{group_name}-{rank}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------- sending
    def send(self, buf: np.ndarray, dst: int, tag: int) -> None:
        data = buf.reshape(-1).view(np.uint8)
        if dst == self.rank:
            self._deliver_local(data, tag)
            return
        mesh = self._mesh()
        sock = mesh.p2p_socket(dst, time.monotonic() + self.timeout)
        self._watch(dst, sock)
        hdr = F.pack(F.P2P, F.op_code("send"), F.dtype_code(buf.dtype), 0, 0, self.ghash, 0, 0, tag,
                     buf.size, data.nbytes)
        lock = self._send_locks.setdefault(dst, threading.Lock())
        with lock:
            try:
                _net.send_all(sock, hdr, data)
            except OSError as err:
                raise DistNetworkError(
                    f"group {self.group_name!r}: send to rank {dst} ({mesh.host_of(dst)}) failed: {err}",
                    rank=dst, host=mesh.host_of(dst)) from None

    def _deliver_local(self, data, tag) -> None:
        with self._lock:
            for i, r in enumerate(self._posted):
                if r.matches(self.rank, tag):
                    del self._posted[i]
                    break
            else:
                self._unexpected.append((self.rank, tag, data.copy()))
                return
        self._fill(r, self.rank, data)

    def _fill(self, r: _Recv, src: int, data) -> None:
        dst = r.buf.reshape(-1).view(np.uint8)
        if dst.nbytes != len(data):
            r.work._fail(DistMismatchError(
                f"group {self.group_name!r}: recv on rank {self.rank} (tag {r.tag}) expects {dst.nbytes} bytes; "
                f"rank {src} sent {len(data)} bytes"))
            return
        np.copyto(dst, np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data)
        r.work._outputs = [src]
        r.work._complete()

    # ------------------------------------------------------------- receiving
    def post(self, buf: np.ndarray, src: int | None, tag: int, work: Work) -> None:
        if src is not None and src != self.rank and src in self._dead:
            work._fail(self._dead[src])
            return
        with self._lock:
            for i, (s, t, data) in enumerate(self._unexpected):
                if (src is None or src == s) and t == tag:
                    del self._unexpected[i]
                    break
            else:
                self._posted.append(_Recv(buf, src, tag, work, time.monotonic() + self.timeout))
                data = None
        if data is not None:
            self._fill(_Recv(buf, src, tag, work, 0), s, data)
            return
        # watch the peers we wait on, so that their death fails this receive
        mesh = self._mesh()
        for p in ([src] if src is not None else range(self.size)):
            if p != self.rank and not mesh.has_p2p(p):
                try:
                    self._watch(p, mesh.p2p_socket(p, time.monotonic() + self.timeout))
                except Exception as err:  # noqa: BLE001 - reported through the receive
                    self._peer_lost(p, err)

    def incoming(self, peer: int, sock: socket.socket) -> None:
        """Called by the listener for a peer's new point-to-point connection."""
        self._watch(peer, sock)

    def _watch(self, peer, sock) -> None:
        with self._lock:
            if any(s is sock for s in self._socks):
                return
            self._socks.append(sock)
            self._new.append((peer, sock))
        try:
            os.write(self._wr, b"x")
        except OSError:
            pass

    # ------------------------------------------------------------- reader
    def _loop(self) -> None:
        watched = set()
        while not self._closed:
            with self._lock:
                new, self._new = self._new, []
            for peer, sock in new:
                if id(sock) not in watched:
                    watched.add(id(sock))
                    try:
                        self._sel.register(sock, selectors.EVENT_READ, peer)
                    except (ValueError, KeyError, OSError):
                        pass
            try:
                events = self._sel.select(timeout=0.5)
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
                    self._read_frame(key.data, key.fileobj)
                except Exception as err:  # noqa: BLE001 - OSError, FrameError, MemoryError: the stream is lost
                    try:
                        self._sel.unregister(key.fileobj)
                    except (KeyError, ValueError):
                        pass
                    try:
                        key.fileobj.shutdown(socket.SHUT_RDWR)  # a corrupt stream is not read again
                    except OSError:
                        pass
                    if not self._closed:
                        self._peer_lost(key.data, err)
            self._expire()

    def _read_frame(self, peer: int, sock: socket.socket) -> None:
        h = F.unpack(_net.recv_exact(sock, F.HDR_SIZE))
        if h.kind != F.P2P or h.group != self.ghash:
            raise F.FrameError(f"unexpected frame kind {h.kind} on a point-to-point stream")
        with self._lock:
            for i, r in enumerate(self._posted):
                if r.matches(peer, h.root):
                    del self._posted[i]
                    break
            else:
                r = None
        if r is not None and r.buf.nbytes == h.nbytes:
            if h.nbytes:
                _net.recv_into_exact(sock, memoryview(r.buf.reshape(-1).view(np.uint8)))
            r.work._outputs = [peer]
            r.work._complete()
            return
        data = _recv_payload(sock, h.nbytes)
        if r is None:
            # a receive may have been posted while the payload was arriving
            with self._lock:
                for i, r in enumerate(self._posted):
                    if r.matches(peer, h.root):
                        del self._posted[i]
                        break
                else:
                    r = None
                    self._unexpected.append((peer, h.root, data))
        if r is not None:
            self._fill(r, peer, data)  # copies, or fails the receive on a size mismatch

    def _peer_lost(self, peer: int, err) -> None:
        mesh = self._mesh()
        host = mesh.host_of(peer)
        exc = err if isinstance(err, DistNetworkError) else DistNetworkError(
            f"group {self.group_name!r}: lost point-to-point connection to rank {peer} ({host}): "
            f"{err or 'connection closed'}", rank=peer, host=host)
        self._dead[peer] = exc
        with self._lock:
            failed = [r for r in self._posted if r.src == peer or r.src is None]
            self._posted = [r for r in self._posted if not (r.src == peer or r.src is None)]
        for r in failed:
            r.work._fail(exc)

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            late = [r for r in self._posted if r.deadline <= now]
            self._posted = [r for r in self._posted if r.deadline > now]
        for r in late:
            r.work._fail(DistTimeoutError(
                f"group {self.group_name!r}: recv on rank {self.rank} from "
                f"{'any rank' if r.src is None else f'rank {r.src}'} (tag {r.tag}) did not complete "
                f"within {self.timeout:g} s"))

    def close(self) -> None:
        self._closed = True
        try:
            os.write(self._wr, b"x")
        except OSError:
            pass
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        with self._lock:
            pending, self._posted = self._posted, []
        for r in pending:
            r.work._fail(DistNetworkError(f"group {self.group_name!r}: backend closed before the receive "
                                          f"completed", rank=r.src))
        self._sel.close()
        for sock in self._socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        for fd in (self._rd, self._wr):
            try:
                os.close(fd)
            except OSError:
                pass


#: an unmatched payload is buffered in pieces of at most this many bytes, so memory
#: follows the bytes that actually arrive, not the length a header announces.
_PIECE = 64 << 20


def _recv_payload(sock: socket.socket, nbytes: int) -> np.ndarray:
    """Read an ``nbytes`` payload nobody posted a buffer for.

    Up to ``_PIECE`` it is one buffer; above, pieces are allocated as bytes
    arrive (a corrupt or forged header announcing a terabyte costs nothing
    until the bytes come, and a peer that closes early is a connection error).
    """
    if nbytes <= _PIECE:
        data = np.empty(nbytes, dtype=np.uint8)
        if nbytes:
            _net.recv_into_exact(sock, memoryview(data))
        return data
    pieces, left = [], nbytes
    while left:
        piece = np.empty(min(left, _PIECE), dtype=np.uint8)
        _net.recv_into_exact(sock, memoryview(piece))
        pieces.append(piece)
        left -= piece.nbytes
    return np.concatenate(pieces)

