"""Reduction kernels: NumPy ufuncs with ``out=``, in rank order, no per-element Python.

Semantics follow torch.distributed: on ``bool`` SUM and MAX are logical or,
PRODUCT and MIN logical and; AVG is the sum divided by the group size, with
integer division truncating toward zero for integer dtypes (NCCL's ``ncclAvg``,
``_intavg.py``; Gloo refuses AVG outright); PREMUL_SUM multiplies the sum by ``scale``
(mathematically the same as scaling each input; rounding may differ in the
last place for floats). MIN / MAX / bitwise ops are refused for complex
dtypes, bitwise ops for floating dtypes, AVG and PREMUL_SUM for ``bool``.
"""

from __future__ import annotations

import numpy as np

from ...._intavg import truncating_divide
from ...._reduce_op import ReduceOp

__all__ = ["reduce_ordered", "finalize", "UFUNC", "ERRVAR", "IGNORE_ERRORS"]

UFUNC = {
    ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PREMUL_SUM: np.add,
    ReduceOp.PRODUCT: np.multiply, ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum,
    ReduceOp.BAND: np.bitwise_and, ReduceOp.BOR: np.bitwise_or, ReduceOp.BXOR: np.bitwise_xor,
}
_BITWISE = (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)

# ``np.errstate(all="ignore")`` builds its error state on every ``with`` (about 1 us,
# a twentieth of a small all_reduce). NumPy 2 keeps that state in a context variable:
# set a prebuilt "ignore all" state directly when that private hook exists, else
# fall back to errstate.
try:
    from numpy._core._ufunc_config import _extobj_contextvar as ERRVAR
    from numpy._core._ufunc_config import _make_extobj

    IGNORE_ERRORS = _make_extobj(all="ignore")
except (ImportError, AttributeError, TypeError):  # pragma: no cover - other NumPy versions
    ERRVAR = IGNORE_ERRORS = None


def reduce_ordered(out: np.ndarray, contribs: list, op: ReduceOp) -> None:
    """``out = contribs[0] (op) contribs[1] (op) ...`` in that order.

    ``out`` may be one of ``contribs[0]`` / ``contribs[1]`` (each ufunc here
    is exactly commutative), but no later one.
    """
    f = UFUNC[op]
    if len(contribs) == 1:
        if contribs[0] is not out:
            np.copyto(out, contribs[0])
        return
    if out.dtype.kind in "biu":  # integer ufuncs wrap without warnings
        _fold(f, out, contribs)
        return
    # overflow to inf is a result, as in torch: no warning
    if ERRVAR is None:  # pragma: no cover - other NumPy versions
        with np.errstate(all="ignore"):
            _fold(f, out, contribs)
        return
    token = ERRVAR.set(IGNORE_ERRORS)
    try:
        _fold(f, out, contribs)
    finally:
        ERRVAR.reset(token)


def _fold(f, out: np.ndarray, contribs: list) -> None:
    f(contribs[0], contribs[1], out=out)
    for c in contribs[2:]:
        f(out, c, out=out)


def finalize(out: np.ndarray, op: ReduceOp, scale, size: int) -> None:
    if op == ReduceOp.AVG:
        if out.dtype.kind in "iu":
            truncating_divide(out, size)
        else:
            with np.errstate(all="ignore"):
                np.divide(out, out.dtype.type(size), out=out)
    elif op == ReduceOp.PREMUL_SUM:
        s = np.asarray(scale)
        if s.size != 1:
            raise ValueError(f"scale: expected a scalar factor, got an array of shape {s.shape}")
        np.multiply(out, s.reshape(()), out=out, casting="unsafe")
