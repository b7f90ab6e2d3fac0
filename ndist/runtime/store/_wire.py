"""Framing of the TCPStore protocol (shared by client and server).

A frame is ``u32 length`` followed by ``length`` bytes of payload; the
payload is one byte (an op code in requests, a status in replies) followed by
zero or more byte strings, each ``u32 length`` + bytes. Lengths are checked
against ``MAX_FRAME`` before anything is allocated, and a frame's buffer
grows only with the bytes that actually arrive (1 MiB at a time), so a
forged length cannot exhaust memory: a length over the cap raises
``FrameError`` and the connection is dropped; a client that announces 1 GiB
and sends nothing costs nothing. Values are opaque bytes; nothing is ever
unpickled.
"""

from __future__ import annotations

import enum
import socket
import struct

from .._net import recv_exact, send_all

__all__ = ["Op", "Status", "MAX_FRAME", "FrameError", "send_frame", "recv_frame", "encode", "decode"]

MAX_FRAME = 1 << 30  # 1 GiB: larger frames are refused, not allocated
#: frames up to this size are read into one buffer allocated up front; larger ones
#: in pieces of this size, as they arrive
_PIECE = 1 << 20
_U32 = struct.Struct("!I")


class Op(enum.IntEnum):
    SET = 1
    GET = 2
    ADD = 3
    COMPARE_SET = 4
    WAIT = 5
    CHECK = 6
    DELETE = 7
    NUM_KEYS = 8
    MULTI_GET = 9
    MULTI_SET = 10
    APPEND = 11
    HELLO = 12  # a worker announces itself (counted for wait_for_workers)
    WAIT_WORKERS = 13
    PING = 14


class Status(enum.IntEnum):
    OK = 0
    TIMEOUT = 1  # args: the keys still missing
    ERROR = 2  # args: one message


class FrameError(ConnectionError):
    """A malformed or oversized frame: the connection cannot be trusted any more."""


def encode(code: int, args: list[bytes] | tuple[bytes, ...] = ()) -> list[bytes]:
    """The buffers of one frame (length header included), ready for ``send_all``."""
    parts: list[bytes] = [bytes((code,))]
    total = 1
    for a in args:
        parts.append(_U32.pack(len(a)))
        parts.append(a)
        total += 4 + len(a)
    if total > MAX_FRAME:
        raise ValueError(f"value: a store request is limited to {MAX_FRAME} bytes, got {total}")
    return [_U32.pack(total), *parts]


def decode(payload: bytes) -> tuple[int, list[bytes]]:
    if not payload:
        raise FrameError("empty frame")
    code, args, pos, n = payload[0], [], 1, len(payload)
    while pos < n:
        if pos + 4 > n:
            raise FrameError("truncated argument length")
        (k,) = _U32.unpack_from(payload, pos)
        pos += 4
        if pos + k > n:
            raise FrameError(f"argument of {k} bytes overruns the frame")
        args.append(payload[pos : pos + k])
        pos += k
    return code, args


def send_frame(sock: socket.socket, code: int, args=()) -> None:
    send_all(sock, *encode(code, args))


def recv_frame(sock: socket.socket) -> tuple[int, list[bytes]]:
    """Read one frame. ``ConnectionResetError`` on EOF, ``FrameError`` on garbage."""
    (length,) = _U32.unpack(recv_exact(sock, 4))
    if length == 0 or length > MAX_FRAME:
        raise FrameError(f"frame length {length} outside 1..{MAX_FRAME}")
    return decode(_recv_payload(sock, length))


def _recv_payload(sock: socket.socket, length: int) -> bytes:
    """``length`` bytes; memory grows with what arrived (never with what was announced)."""
    if length <= _PIECE:
        return recv_exact(sock, length)
    parts, got = [], 0
    while got < length:
        part = sock.recv(min(length - got, _PIECE))  # (the unused tail of a short read is freed)
        if not part:
            raise ConnectionResetError(f"connection closed by peer after {got} of {length} bytes")
        parts.append(part)
        got += len(part)
    return b"".join(parts)
