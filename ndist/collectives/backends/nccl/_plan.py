"""How a (dtype, ReduceOp) pair is carried out with the operations NCCL has.

Pure Python on purpose: no CuPy import, so the mapping is tested on machines
without a GPU. The integers are NCCL's ``ncclDataType_t`` / ``ncclRedOp_t``
values from ``nccl.h``; they are part of NCCL's ABI and the backend checks
them against ``cupy.cuda.nccl`` once when it starts.

What NCCL lacks and what we do instead:

* ``bool``: reduced as ``uint8`` (0/1): SUM and BOR -> MAX, PRODUCT and BAND
  -> MIN, MIN/MAX as such (torch does the same).
* complex: reduced as pairs of reals for SUM, AVG and PREMUL_SUM (the scale is
  applied as a complex product first); other ops are undefined for complex.
* ``int16`` / ``uint16``: NCCL has no 16-bit integers; reductions run on an
  ``int32`` / ``uint32`` copy and cast back. Two's-complement wrap-around makes
  SUM and PRODUCT modulo 2**16 identical to reducing in 16 bits. AVG is an
  ncclSum there, cast back, then divided in 16 bits (so it wraps as SUM does).
* AVG on integers: ``ncclAvg`` (the sum in the dtype, divided toward zero:
  ``_intavg.py``); on an NCCL without ncclAvg, ncclSum and the same division
  afterwards, which gives the same bits.
* PREMUL_SUM: the input is multiplied by the factor on the stream, then summed
  with ncclSum (no ncclRedOpCreatePreMulSum, which CuPy does not bind).
* BAND / BOR / BXOR on integers: NCCL has no bitwise reductions; a clear
  ``ValueError`` (torch's NCCL backend refuses them too).

Data movement (broadcast, gather, all_to_all, send/recv) is type-agnostic and
always moves bytes (``ncclUint8``), so every dtype works there.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..._reduce_op import ReduceOp

__all__ = ["NCCL_DTYPES", "NCCL_OPS", "ReductionPlan", "reduction_plan", "BYTES"]

# ncclDataType_t (nccl.h)
INT8, UINT8, INT32, UINT32, INT64, UINT64, FLOAT16, FLOAT32, FLOAT64, BFLOAT16 = range(10)
BYTES = UINT8
# ncclRedOp_t (nccl.h)
SUM, PROD, MAX, MIN, AVG = range(5)

NCCL_DTYPES = {
    "int8": INT8,
    "uint8": UINT8,
    "int32": INT32,
    "uint32": UINT32,
    "int64": INT64,
    "uint64": UINT64,
    "float16": FLOAT16,
    "float32": FLOAT32,
    "float64": FLOAT64,
    "bfloat16": BFLOAT16,
}
NCCL_OPS = {ReduceOp.SUM: SUM, ReduceOp.PRODUCT: PROD, ReduceOp.MAX: MAX, ReduceOp.MIN: MIN, ReduceOp.AVG: AVG}

_BOOL_OPS = {
    ReduceOp.SUM: MAX,
    ReduceOp.BOR: MAX,
    ReduceOp.MAX: MAX,
    ReduceOp.PRODUCT: MIN,
    ReduceOp.BAND: MIN,
    ReduceOp.MIN: MIN,
}
_UPCAST = {"int16": "int32", "uint16": "uint32"}
_COMPLEX_REAL = {"complex64": "float32", "complex128": "float64"}

# ncclAvg exists from NCCL 2.10 (version code 21000).
_NCCL_AVG_VERSION = 21000


@dataclass(frozen=True)
class ReductionPlan:
    """One reduction as NCCL runs it.

    ``view`` says how the user's buffer becomes NCCL's: ``"same"`` (as is),
    ``"reinterpret"`` (a view as ``work_dtype``: bool as uint8, complex as
    pairs of reals, so the element count changes by ``count_factor``) or
    ``"upcast"`` (a temporary ``work_dtype`` copy, cast back afterwards).
    ``premul`` asks for the input to be scaled before an ncclSum;
    ``divide`` asks for the result to be divided by the group size
    afterwards (AVG on an NCCL without ncclAvg, and AVG on an upcast 16-bit
    integer, divided after the cast back).
    """

    nccl_dtype: int
    nccl_op: int
    view: str = "same"
    work_dtype: str | None = None
    count_factor: int = 1
    premul: bool = False
    divide: bool = False


def _unsupported(op: ReduceOp, dtype: str, why: str) -> ValueError:
    return ValueError(f"op: {op!r} is not supported by the nccl backend for dtype {dtype} ({why})")


def reduction_plan(dtype_name: str, op: ReduceOp, nccl_version: int = 1 << 30) -> ReductionPlan:
    """The plan for reducing ``dtype_name`` arrays with ``op``; ``ValueError`` if NCCL cannot."""
    if not isinstance(op, ReduceOp):
        raise TypeError(f"op: expected ndist.ReduceOp, got {type(op).__name__}")
    has_avg = nccl_version >= _NCCL_AVG_VERSION
    if dtype_name == "bool":
        if op not in _BOOL_OPS:
            raise _unsupported(op, dtype_name, "bool supports SUM, PRODUCT, MIN, MAX, BAND, BOR")
        return ReductionPlan(UINT8, _BOOL_OPS[op], view="reinterpret", work_dtype="uint8")
    if dtype_name in _COMPLEX_REAL:
        real = _COMPLEX_REAL[dtype_name]
        if op not in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PREMUL_SUM):
            raise _unsupported(op, dtype_name, "complex numbers have no order or product NCCL could use; "
                               "supported: SUM, AVG, PREMUL_SUM")
        return _numeric(dtype_name, NCCL_DTYPES[real], op, has_avg, float_like=True,
                        view="reinterpret", work_dtype=real, count_factor=2)
    if dtype_name in _UPCAST:
        return _numeric(dtype_name, NCCL_DTYPES[_UPCAST[dtype_name]], op, has_avg, float_like=False,
                        view="upcast", work_dtype=_UPCAST[dtype_name])
    if dtype_name in NCCL_DTYPES:
        float_like = dtype_name.startswith(("float", "bfloat"))
        return _numeric(dtype_name, NCCL_DTYPES[dtype_name], op, has_avg, float_like=float_like)
    raise ValueError(
        f"tensor: dtype {dtype_name} cannot be reduced by the nccl backend; supported: "
        f"bool, int8-64, uint8-64, float16, bfloat16, float32, float64, complex64, complex128"
    )


def _numeric(dtype: str, nccl_dtype: int, op: ReduceOp, has_avg: bool, *, float_like: bool, **kw) -> ReductionPlan:
    if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR):
        raise _unsupported(op, dtype, "NCCL has no bitwise reductions")
    if op is ReduceOp.PREMUL_SUM:
        return ReductionPlan(nccl_dtype, SUM, premul=True, **kw)
    if op is ReduceOp.AVG and (not has_avg or kw.get("view") == "upcast"):
        # ncclSum then the division: an integer sum wraps in NCCL exactly as ncclAvg's does,
        # and is divided toward zero afterwards, so the emulation is exact. A 16-bit integer
        # is summed in 32 bits, cast back (wrapping as a 16-bit sum would) and only then
        # divided: ncclAvg on the 32-bit copy would divide a sum that never wrapped.
        return ReductionPlan(nccl_dtype, SUM, divide=True, **kw)
    return ReductionPlan(nccl_dtype, NCCL_OPS[op], **kw)
