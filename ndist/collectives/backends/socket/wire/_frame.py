"""Frame headers of the socket backend: layout, codes, pack/unpack, checks.

Every message on a data connection starts with one fixed 56-byte header::

    magic u16 | kind u8 | op u8 | dtype u8 | step u8 | flags u8 | redop u8
    group u32 | shm_gen u32 | seq u64 | root i64 | count u64 | nbytes u64 | offset u64

``kind`` is DATA (a collective's payload, inline or as a reference into the
sender's shared-memory segment when ``flags & SHM``, or the address of the
sender's own buffer, to read with ``process_vm_readv``, when ``flags & CMA``),
ACK (the receiver is done reading the sender's segment), ABORT (the sender failed this op; a short JSON
reason follows) or P2P (a send, ``root`` is the tag; or with op ``bye`` the
sender's last frame on that stream, see ``_p2p``). ``count`` is the element
count of the sender's call; ``redop`` the reduce op of a reduction (0 for other
ops), so ranks that reduce with different ops fail instead of mixing them.
Every field is checked by ``unpack`` before anything is allocated for it.
"""

from __future__ import annotations

import json
import struct
from typing import NamedTuple

import numpy as np

__all__ = [
    "HEADER", "HDR_SIZE", "DATA", "ACK", "ABORT", "P2P", "F_SHM", "F_CMA", "OPS", "op_code",
    "dtype_code", "dtype_name", "Header", "pack", "unpack", "FrameError", "MAX_NBYTES",
    "MAX_ABORT", "describe", "pack_abort", "unpack_abort", "group_hash", "REDOPS", "redop_code",
]

HEADER = struct.Struct("<HBBBBBBIIQqQQQ")
HDR_SIZE = HEADER.size
_MAGIC = 0x4E44

DATA, ACK, ABORT, P2P = 1, 2, 3, 4
_KINDS = (DATA, ACK, ABORT, P2P)
F_SHM = 1
#: ``offset`` is an address in the sender's memory, read with ``process_vm_readv``
F_CMA = 2

#: largest payload one frame may announce (1 TiB): a header beyond it is corrupt.
MAX_NBYTES = 1 << 40
#: largest ABORT reason.
MAX_ABORT = 1 << 16

OPS = ("", "all_reduce", "reduce", "reduce_scatter", "broadcast", "all_gather", "gather",
       "scatter", "all_to_all", "barrier", "send", "bye")
_OP_CODES = {name: i for i, name in enumerate(OPS)}

#: reduce op codes (by ``ReduceOp.name``); fixed, as they travel between processes
REDOPS = ("", "SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR", "PREMUL_SUM")
_REDOP_CODES = {name: i for i, name in enumerate(REDOPS)}

# Fixed table: codes must agree between processes, so never use dtype.num
# (extension dtypes such as bfloat16 get process-dependent numbers).
_DTYPES = ("other", "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
           "uint64", "float16", "float32", "float64", "complex64", "complex128", "bfloat16",
           "float8_e4m3fn", "float8_e5m2")
_DTYPE_CODES = {name: i for i, name in enumerate(_DTYPES)}


class FrameError(ConnectionError):
    """A header failed its checks: the stream is corrupt or not ours."""


class Header(NamedTuple):
    kind: int
    op: int
    dtype: int
    step: int
    flags: int
    group: int
    shm_gen: int
    seq: int
    root: int
    count: int
    nbytes: int
    offset: int
    redop: int = 0


def op_code(name: str) -> int:
    return _OP_CODES[name]


def redop_code(op) -> int:
    """The code of a ``ReduceOp`` (0 for None: not a reduction)."""
    return 0 if op is None else _REDOP_CODES[op.name]


_dtype_cache: dict = {}


def dtype_code(dtype: np.dtype) -> int:
    code = _dtype_cache.get(dtype)
    if code is None:
        code = _dtype_cache[dtype] = _DTYPE_CODES.get(np.dtype(dtype).name, 0)
    return code


def dtype_name(code: int) -> str:
    return _DTYPES[code] if 0 <= code < len(_DTYPES) else f"dtype#{code}"


def group_hash(name: str) -> int:
    import zlib

    return zlib.crc32(name.encode())


def pack(kind, op, dtype, step, flags, group, shm_gen, seq, root, count, nbytes, offset=0, redop=0) -> bytes:
    return HEADER.pack(_MAGIC, kind, op, dtype, step, flags, redop, group, shm_gen, seq, root, count, nbytes,
                       offset)


def unpack(raw) -> Header:
    """Parse and bounds-check one header (raises ``FrameError``)."""
    magic, kind, op, dt, step, flags, redop, group, gen, seq, root, count, nbytes, offset = HEADER.unpack(raw)
    if magic != _MAGIC:
        raise FrameError(f"bad frame magic {magic:#06x}")
    if kind not in _KINDS:
        raise FrameError(f"bad frame kind {kind}")
    if not 0 < op < len(OPS) and kind != ABORT:
        raise FrameError(f"bad op code {op}")
    if dt >= len(_DTYPES):
        raise FrameError(f"bad dtype code {dt}")
    if redop >= len(REDOPS):
        raise FrameError(f"bad reduce op code {redop}")
    if flags & ~(F_SHM | F_CMA) or flags == F_SHM | F_CMA or (flags == F_CMA and kind != DATA):
        raise FrameError(f"bad frame flags {flags:#x}")
    if nbytes > MAX_NBYTES or (offset > MAX_NBYTES and flags != F_CMA) or count > MAX_NBYTES:
        raise FrameError(f"frame announces {nbytes} bytes at offset {offset}, above the limit {MAX_NBYTES}")
    if kind == ABORT and nbytes > MAX_ABORT:
        raise FrameError(f"abort reason of {nbytes} bytes is above the limit {MAX_ABORT}")
    if kind in (ACK, ABORT) and flags:
        raise FrameError("ACK/ABORT frames carry no shared-memory reference")
    return Header(kind, op, dt, step, flags, group, gen, seq, root, count, nbytes, offset, redop)


def describe(rank: int, op: int, dtype: int, count: int, seq: int, root: int | None = None,
             redop: int = 0) -> str:
    """``"rank 1: all_gather float32[4] #17"`` (root shown for rooted ops, the reduce
    op for reductions: ``"rank 0: reduce float64[3] SUM root=0 #4"``)."""
    name = OPS[op] if 0 <= op < len(OPS) else f"op#{op}"
    text = f"rank {rank}: {name} {dtype_name(dtype)}[{count}]"
    if redop:
        text += f" {REDOPS[redop] if 0 <= redop < len(REDOPS) else f'redop#{redop}'}"
    if root is not None and name in ("reduce", "broadcast", "gather", "scatter"):
        text += f" root={root}"
    return f"{text} #{seq}"


def pack_abort(kind: str, message: str, rank=None, host=None, ranks=None, final: bool = False) -> bytes:
    """The JSON reason of an ABORT; ``ranks`` (kind ``stalled``): the global ranks not heard
    from; ``final``: the sender raised naming them (not a first notice it may still refine)."""
    reason = {"kind": kind, "msg": message[:8000], "rank": rank, "host": host}
    if ranks is not None:
        reason["ranks"] = [int(r) for r in ranks][:4096]
    if final:
        reason["final"] = True
    body = json.dumps(reason).encode()
    return body[:MAX_ABORT]


def unpack_abort(body: bytes) -> dict:
    try:
        data = json.loads(body.decode("utf-8", "replace"))
        if not isinstance(data, dict):
            raise ValueError
    except ValueError:
        return {"kind": "unknown", "msg": "unreadable abort reason", "rank": None, "host": None}
    return data
