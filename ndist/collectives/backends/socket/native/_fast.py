"""The Python half of the repeated call in one C call (``clane.c``'s ``FastLane``; docs/architecture.md,
"One call, by hand"): what a group's FastLane is made of, and the two hooks it calls back.
``core`` makes the same object for the engine's C interface (``capi.c``'s ``nd_lane_call``: the
bookkeeping of a table call in C), with no Python lane behind it.

* ``describe(dtype)``, once per dtype: its wire code, element size, the reduce ops C may run on
  it (those the public layer's plain check takes, ``_check.PLAIN_OPS``, with a native kernel,
  and for AVG a finish C does bit for bit as ``schedules/_reduce.finalize``: float32, float64
  and the integers but uint64), and whether it is a plain dtype (``_check.PLAIN_DTYPES``).
* ``failure(err, entry, seq)``, only when an op failed: the thin lane's mapping
  (``SocketBackend._native_failure``), the claim ended (``Executor.leave``), the outcome
  recorded (the public layer's ``_failed``, which may raise the group's
  ``DistRankFailureError`` instead), then the error raised: what the Python path raises.
"""

from __future__ import annotations

import numpy as np

from ...._backend import Op
from ...._check import PLAIN_DTYPES, PLAIN_OPS
from ...._convert import BUFFER_FORMATS
from ...._debug import T_DONE
from ...._reduce_op import ReduceOp
from ..wire import _frame as F
from ._engine import RSAG_MIN
from ._twolevel import compiled

__all__ = ["make", "core"]

_AVG = F.redop_code(ReduceOp.AVG)
_AVG_CODES = frozenset(F.dtype_code(np.dtype(t)) for t in ("int8", "uint8", "int16", "uint16", "int32", "uint32",
                                                             "int64", "float32", "float64"))
# DLPack's dtype codes (dlpack.h: kDLInt, kDLUInt, kDLFloat, kDLComplex, kDLBool) and bits -> the dtype
# ``np.from_dlpack`` and ``torch.Tensor.numpy()`` give: what FastLane reads a DLPack tensor as
_DLPACK_DTYPES = tuple((code, np.dtype(name).itemsize * 8, np.dtype(name)) for code, names in (
    (0, ("int8", "int16", "int32", "int64")), (1, ("uint8", "uint16", "uint32", "uint64")),
    (2, ("float16", "float32", "float64")), (5, ("complex64", "complex128")), (6, ("bool",))) for name in names)
# a buffer's struct format -> the dtype the public layer reads it as (``_convert.BUFFER_FORMATS``)
_BUFFER_DTYPES = tuple(BUFFER_FORMATS.items())
# ReduceOp members by wire code (index 0 and PREMUL_SUM's code: None, never run in C)
_REDOPS = tuple(next((op for op in ReduceOp if op is not ReduceOp.PREMUL_SUM and F.redop_code(op) == code), None)
                for code in range(9))


class _Hooks:
    __slots__ = ("backend", "nat", "ex", "rec", "failed", "mod")

    def __init__(self, backend, nat, ex, rec, failed) -> None:
        self.backend, self.nat, self.ex, self.rec, self.failed = backend, nat, ex, rec, failed
        self.mod = nat.mod

    def describe(self, dtype) -> tuple:
        if dtype not in PLAIN_DTYPES:
            return (0, 0, 0, 0)
        code = F.dtype_code(dtype)
        mask = 0
        for rc, op in enumerate(_REDOPS):
            if op is not None and (op._value_, dtype) in PLAIN_OPS and self.mod.supports(code, rc) and \
                    (rc != _AVG or code in _AVG_CODES):
                mask |= 1 << rc
        return (code, dtype.itemsize, mask, 1)

    def failure(self, err, entry, seq) -> None:
        try:
            exc = self.backend.native_failure(self.nat, err)
        finally:
            self.ex.leave()
        self.failed(self.rec, entry, seq, exc)
        if exc is err:
            raise exc
        raise exc from None


def make(backend, nat, ex, plain, failed):
    """A ``FastLane`` for ``backend``'s group on native algorithms ``nat`` (its executor ``ex``),
    behind the group's Python lane ``plain`` (a ``PlainLane``: its ``lane`` gives the counter,
    the recorder and the global -> group rank map); ``failed`` is the public layer's. None
    where NDIST_DEBUG is DETAIL. Its group is the compiled one: a same-host ``Group``, a
    ``TcpGroup`` or a two-level group's ``TwoGroup`` (``_twolevel.compiled``)."""
    lane = plain.lane
    return _new(backend, nat, ex, lane.book, dict(lane.group_rank), plain, failed)


def core(backend, nat, ex, book, failed):
    """The group's C core for the engine's C interface (``capi.c``, ``nd_lane_call``): a
    ``FastLane`` with no Python lane behind it (its methods answer False for what they do
    not take), over the public layer's lane book ``book`` (counter, recorder append, DETAIL,
    group, recorder). None where ``make`` gives none."""
    return _new(backend, nat, ex, book, {}, None, failed)


def _new(backend, nat, ex, book, group_rank, plain, failed):
    mod = nat.mod
    seqs, record, detail, _pg, rec = book
    if detail:  # NDIST_DEBUG=DETAIL: the signature check runs in Python (run_fields)
        return None
    group = compiled(nat.g)
    if not isinstance(group, (mod.Group, mod.TcpGroup, mod.TwoGroup)) or not isinstance(ex.state, mod.LaneState):
        return None
    # the lane's counter and the recorder's ring are the C ones (the recorder adopted them when
    # the public layer made the lane: SocketBackend.recorder_types), which C writes directly
    ring = rec.ring if record is not None else None
    if not isinstance(seqs, mod.Counter) or (ring is not None and not isinstance(ring, mod.Ring)):
        return None
    probe = np.empty(3, np.float32)
    hooks = _Hooks(backend, nat, ex, rec, failed)
    fast = mod.FastLane(ex.state, group, ex, seqs, ring, plain, hooks.failure,
                        hooks.describe, np.ndarray, group_rank, _REDOPS,
                        (Op.ALL_REDUCE, Op.BROADCAST, Op.ALL_TO_ALL_SINGLE, Op.ALL_GATHER_INTO, Op.REDUCE_SCATTER_FROM,
                         Op.BARRIER), RSAG_MIN,
                        T_DONE, probe, probe.__array_interface__["data"][0])
    fast.dlpack_dtypes(_DLPACK_DTYPES)  # torch tensors and other DLPack arrays, read in C too
    fast.buffer_dtypes(_BUFFER_DTYPES)  # memoryview, bytearray, array.array...: the Python path's table
    nat.lanes.append(fast)  # (``desc`` names the op it ran last)
    return fast
