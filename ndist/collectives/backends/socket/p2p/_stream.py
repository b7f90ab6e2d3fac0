"""The byte-level pieces of point-to-point streams (``_p2p``): one stream as the
reader sees it, small control frames written without blocking past a deadline,
and unmatched payloads buffered as their bytes arrive."""

from __future__ import annotations

import select
import socket
import threading
import time

import numpy as np

from .....runtime import _net

__all__ = ["Stream", "send_ctl", "recv_payload"]


class Stream:
    """One point-to-point connection as this rank sees it: ``outgoing`` (this rank
    opened it and sends on it) or incoming (the peer sends on it)."""

    __slots__ = ("peer", "sock", "outgoing", "wlock", "bye_in", "bye_out", "bye_ok", "ended", "frames")

    def __init__(self, peer: int, sock: socket.socket, outgoing: bool):
        self.peer = peer
        self.sock = sock
        self.outgoing = outgoing
        self.wlock = threading.Lock()  # one writer at a time (frames never interleave)
        self.bye_in = False  # the peer said bye on it
        self.bye_out = False  # this rank said bye on it
        self.bye_ok = False  # ... and the bye was written
        self.ended = False
        self.frames = 0  # whole frames read from it (the peer's own stream carried some)


def send_ctl(sock: socket.socket, data: bytes, deadline: float) -> bool:
    """Write a small control frame without blocking past ``deadline``; False if it
    could not (the peer is gone, or does not read)."""
    view = memoryview(data)
    while view:
        try:
            n = sock.send(view, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            poller = select.poll()
            poller.register(sock, select.POLLOUT)
            poller.poll(min(left, 0.5) * 1000.0)
            continue
        except OSError:
            return False
        view = view[n:]
    return True


#: an unmatched payload is buffered in pieces of at most this many bytes, so memory
#: follows the bytes that actually arrive, not the length a header announces.
_PIECE = 64 << 20


def recv_payload(sock: socket.socket, nbytes: int) -> np.ndarray:
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
