"""NumPy dtype -> MPI datatype and ReduceOp -> MPI op, cached per dtype.

Data movement uses MPI's own datatype when mpi4py maps the dtype, otherwise
bytes (``MPI.BYTE``, counts scaled by the item size), so bfloat16 and other
extension dtypes move unchanged. Reductions use MPI's ops on the dtype;
float16 / bfloat16 reduce in float32 (MPI has no portable half-precision
arithmetic), bool reduces as uint8 with bitwise ops (SUM = OR, PRODUCT = AND).
"""

from __future__ import annotations

import numpy as np

from ..._reduce_op import ReduceOp

__all__ = ["move_type", "reduce_plan"]

_move_cache: dict = {}
_reduce_cache: dict = {}


def move_type(MPI, dtype: np.dtype):
    """``(mpi_datatype, unit)``: an array of ``n`` items is ``n * unit`` of the datatype."""
    try:
        return _move_cache[(dtype.char, dtype.itemsize)]
    except KeyError:
        pass
    entry = (MPI.BYTE, dtype.itemsize)
    if dtype.kind in "biufc" and dtype.isnative and dtype.names is None and dtype.type.__module__ == "numpy":
        # mpi4py's table of predefined datatypes ("i8", "f4", "c16", "?"): MPI's
        # reduction ops are defined on these, not on user-defined duplicates.
        key = "?" if dtype.kind == "b" else f"{dtype.kind}{dtype.itemsize}"
        mtype = MPI._typedict.get(key)
        if mtype is not None and mtype != MPI.DATATYPE_NULL and mtype.Get_size() == dtype.itemsize:
            entry = (mtype, 1)
    _move_cache[(dtype.char, dtype.itemsize)] = entry
    return entry


_HALF = ("float16", "bfloat16")


def reduce_plan(MPI, dtype: np.dtype, op: ReduceOp):
    """``(work_dtype, mpi_datatype, mpi_op)`` to reduce ``dtype`` with ``op``.

    ``work_dtype`` differs from ``dtype`` when the data must be staged
    (float32 for half precision, uint8 view for bool). AVG and PREMUL_SUM
    map to SUM; the caller divides / scales.
    """
    key = (dtype.char, dtype.itemsize, op._value_)  # cheaper to hash than (dtype, ReduceOp)
    try:
        return _reduce_cache[key]
    except KeyError:
        pass
    if dtype == np.bool_:
        work = np.dtype(np.uint8)
        mop = {
            ReduceOp.SUM: MPI.BOR, ReduceOp.MAX: MPI.BOR, ReduceOp.BOR: MPI.BOR,
            ReduceOp.PRODUCT: MPI.BAND, ReduceOp.MIN: MPI.BAND, ReduceOp.BAND: MPI.BAND,
            ReduceOp.BXOR: MPI.BXOR,
        }[op]
    else:
        work = np.dtype(np.float32) if dtype.name in _HALF else dtype
        mop = {
            ReduceOp.SUM: MPI.SUM, ReduceOp.AVG: MPI.SUM, ReduceOp.PREMUL_SUM: MPI.SUM,
            ReduceOp.PRODUCT: MPI.PROD, ReduceOp.MIN: MPI.MIN, ReduceOp.MAX: MPI.MAX,
            ReduceOp.BAND: MPI.BAND, ReduceOp.BOR: MPI.BOR, ReduceOp.BXOR: MPI.BXOR,
        }[op]
    mtype, unit = move_type(MPI, work)
    if unit != 1:
        raise TypeError(f"dtype: MPI cannot reduce {dtype} (no MPI datatype for {work})")
    plan = (work, mtype, mop)
    _reduce_cache[key] = plan
    return plan
