"""What each benchmarked operation moves, how its bus bandwidth is computed, and
what its result must be.

Byte counts and bandwidth factors follow nccl-tests (``src/*.cu`` and
``doc/PERFORMANCE.md``): a sweep size ``S`` is split per op into the count each
call passes (``count``), the send and receive buffer lengths, and

    algbw = size / time          size = max(send bytes, receive bytes)
    busbw = algbw * factor(n)

with ``factor`` = 2(n-1)/n for all_reduce; (n-1)/n for reduce_scatter,
all_gather, all_to_all, gather and scatter; 1 for broadcast, reduce and
sendrecv. ``barrier`` moves no data: its bandwidths are 0.

Check data are small integers that depend on the rank and on the element's
position, so every reduction is exact in every dtype (for n up to a few dozen
ranks) and a chunk that lands in the wrong place is counted as wrong.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

__all__ = [
    "OPS",
    "REDOPS",
    "DTYPES",
    "OpSpec",
    "Layout",
    "resolve_dtype",
    "layout",
    "bandwidths",
    "make_buffers",
    "count_wrong",
]


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One benchmarked operation."""

    name: str
    rooted: bool  # has a root rank (printed in the ``root`` column; -1 otherwise)
    reduces: bool  # takes a reduction op (printed in ``redop``; "none" otherwise)
    per_rank_split: bool  # the sweep size is the whole buffer, split into n chunks
    factor: Callable[[int], float]  # busbw = algbw * factor(n)
    min_ranks: int = 1


def _ring(n: int) -> float:
    return 2.0 * (n - 1) / n


def _spread(n: int) -> float:
    return (n - 1) / n


def _one(n: int) -> float:
    return 1.0


OPS: dict[str, OpSpec] = {
    s.name: s
    for s in (
        OpSpec("all_reduce", rooted=False, reduces=True, per_rank_split=False, factor=_ring),
        OpSpec("all_to_all", rooted=False, reduces=False, per_rank_split=True, factor=_spread),
        OpSpec("all_gather", rooted=False, reduces=False, per_rank_split=True, factor=_spread),
        OpSpec("reduce_scatter", rooted=False, reduces=True, per_rank_split=True, factor=_spread),
        OpSpec("broadcast", rooted=True, reduces=False, per_rank_split=False, factor=_one),
        OpSpec("reduce", rooted=True, reduces=True, per_rank_split=False, factor=_one),
        OpSpec("gather", rooted=True, reduces=False, per_rank_split=True, factor=_spread),
        OpSpec("scatter", rooted=True, reduces=False, per_rank_split=True, factor=_spread),
        OpSpec("sendrecv", rooted=False, reduces=False, per_rank_split=False, factor=_one, min_ranks=2),
        OpSpec("barrier", rooted=False, reduces=False, per_rank_split=False, factor=lambda n: 0.0),
    )
}

REDOPS = ("sum", "prod", "max", "min", "avg")

# Canonical names (NumPy's) and the nccl-tests spellings accepted for them.
DTYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32", "float64")
_DTYPE_ALIASES = {"float": "float32", "half": "float16", "double": "float64", "bf16": "bfloat16", "int": "int32"}


def resolve_dtype(name: str) -> np.dtype:
    """The NumPy dtype for a ``-d`` value (``float32`` or nccl-tests' ``float``)."""
    canon = _DTYPE_ALIASES.get(name, name)
    if canon not in DTYPES:
        raise ValueError(f"datatype: expected one of {', '.join(DTYPES)} (or float, half, double); got {name!r}")
    if canon == "bfloat16":
        try:
            import ml_dtypes  # lazily: only this dtype needs it
        except ImportError:
            raise ValueError("datatype: bfloat16 needs the ml_dtypes package (pip install ml_dtypes)") from None

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(canon)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Element counts for one op at one sweep size on n ranks."""

    count: int  # elements per call argument (per rank, per peer chunk for split ops)
    send: int  # elements in each rank's send buffer
    recv: int  # elements in each rank's receive buffer (0: in place)
    size: int  # bytes the bandwidths are computed on (the table's ``size`` column)


def layout(op: str, nbytes: int, itemsize: int, nranks: int) -> Layout:
    """Split a sweep size as nccl-tests does (``*GetCollByteCount``)."""
    spec = OPS[op]
    if op == "barrier":
        return Layout(0, 0, 0, 0)
    total = nbytes // itemsize
    if spec.per_rank_split:
        count = total // nranks
        whole = count * nranks
        send, recv = {
            "all_to_all": (whole, whole),
            "all_gather": (count, whole),
            "reduce_scatter": (whole, count),
            "gather": (count, whole),
            "scatter": (whole, count),
        }[op]
        return Layout(count, send, recv, whole * itemsize)
    in_place = op in ("all_reduce", "broadcast", "reduce")
    return Layout(total, total, 0 if in_place else total, total * itemsize)


def bandwidths(op: str, size: int, seconds: float, nranks: int) -> tuple[float, float]:
    """``(algbw, busbw)`` in GB/s (1e9 bytes per second) for ``size`` bytes in ``seconds``."""
    if seconds <= 0 or size == 0:
        return 0.0, 0.0
    algbw = size / 1.0e9 / seconds
    return algbw, algbw * OPS[op].factor(nranks)


# --------------------------------------------------------------------- check data


def _value_range(dtype: np.dtype, reduces: bool) -> int:
    if reduces:
        return 4  # values 1..4: sums and products stay exact (see module docstring)
    if dtype.itemsize == 1:
        return 120
    if dtype.kind == "f" and dtype.itemsize == 2:
        return 250  # exact in float16 and bfloat16
    return 1 << 20


def _fill(count: int, rank: int, offset: int, dtype: np.dtype, reduces: bool) -> np.ndarray:
    """Deterministic data of ``rank`` for elements ``offset .. offset+count-1``."""
    idx = np.arange(offset, offset + count, dtype=np.int64)
    m = _value_range(dtype, reduces)
    vals = (idx * 7 + rank * 13) % m + (1 if reduces else 0)
    return vals.astype(dtype)


def _reduce(arrays: list[np.ndarray], redop: str) -> np.ndarray:
    acc = arrays[0].copy()
    for a in arrays[1:]:
        if redop in ("sum", "avg"):
            acc += a
        elif redop == "prod":
            acc *= a
        elif redop == "max":
            np.maximum(acc, a, out=acc)
        elif redop == "min":
            np.minimum(acc, a, out=acc)
        else:
            raise ValueError(f"op: expected one of {', '.join(REDOPS)}; got {redop!r}")
    if redop == "avg":  # integers: sum, then division truncating toward zero (as ndist and NCCL)
        if acc.dtype.kind in "iu":
            acc = (np.sign(acc) * (np.abs(acc) // len(arrays))).astype(acc.dtype)
        else:
            acc /= len(arrays)
    return acc


@dataclasses.dataclass
class Buffers:
    """One rank's buffers for one case: ``send`` (also the in-place buffer),
    ``recv`` (``None`` for in-place ops and for ranks that receive nothing) and
    ``expected`` (what must be in the result buffer; ``None``: nothing to check
    on this rank)."""

    send: np.ndarray
    recv: np.ndarray | None
    expected: np.ndarray | None

    @property
    def result(self) -> np.ndarray | None:
        return self.send if self.recv is None else self.recv


def make_buffers(op: str, lay: Layout, dtype: np.dtype, rank: int, nranks: int, root: int, redop: str,
                 with_expected: bool = True) -> Buffers:
    """Initialised buffers and the expected result for ``rank`` (``expected`` is
    ``None`` when ``with_expected`` is false: buffers for timing only)."""
    spec = OPS[op]
    c, n = lay.count, nranks
    red = spec.reduces

    def fill(count, r, offset):
        return _fill(count, r, offset, dtype, red)

    def exp(make, here=True):
        return make() if with_expected and here else None

    if op == "barrier":
        return Buffers(np.zeros(0, dtype), None, None)
    if op == "all_reduce":
        return Buffers(fill(c, rank, 0), None, exp(lambda: _reduce([fill(c, r, 0) for r in range(n)], redop)))
    if op == "reduce":
        return Buffers(fill(c, rank, 0), None,
                       exp(lambda: _reduce([fill(c, r, 0) for r in range(n)], redop), rank == root))
    if op == "reduce_scatter":
        return Buffers(fill(c * n, rank, 0), np.zeros(c, dtype),
                       exp(lambda: _reduce([fill(c, r, rank * c) for r in range(n)], redop)))
    if op == "broadcast":
        buf = fill(c, root, 0) if rank == root else np.zeros(c, dtype)
        return Buffers(buf, None, exp(lambda: fill(c, root, 0)))
    if op == "all_gather":
        return Buffers(fill(c, rank, rank * c), np.zeros(c * n, dtype),
                       exp(lambda: np.concatenate([fill(c, r, r * c) for r in range(n)])))
    if op == "gather":
        recv = np.zeros(c * n, dtype) if rank == root else None
        return Buffers(fill(c, rank, rank * c), recv,
                       exp(lambda: np.concatenate([fill(c, r, r * c) for r in range(n)]), rank == root))
    if op == "scatter":
        send = np.concatenate([fill(c, r, r * c) for r in range(n)]) if rank == root else np.zeros(0, dtype)
        return Buffers(send, np.zeros(c, dtype), exp(lambda: fill(c, rank, rank * c)))
    if op == "all_to_all":
        # chunk j of rank r goes to rank j: it holds r's data for the elements j*c..
        send = np.concatenate([fill(c, rank, j * c) for j in range(n)])
        return Buffers(send, np.zeros(c * n, dtype), exp(lambda: np.concatenate([fill(c, j, rank * c) for j in range(n)])))
    if op == "sendrecv":
        return Buffers(fill(c, rank, 0), np.zeros(c, dtype), exp(lambda: fill(c, (rank - 1) % n, 0)))
    raise ValueError(f"op: expected one of {', '.join(OPS)}; got {op!r}")


def count_wrong(result: np.ndarray | None, expected: np.ndarray | None, nranks: int) -> int:
    """Elements of ``result`` that differ from ``expected`` (exact for integers,
    a few ulps for floating point, where avg divides by n)."""
    if expected is None:
        return 0
    if result is None or result.shape != expected.shape:
        return int(expected.size)
    if expected.dtype.kind == "f" or expected.dtype.name == "bfloat16":
        a = result.astype(np.float64)
        b = expected.astype(np.float64)
        eps = float(np.finfo(np.float16).eps) if expected.dtype.itemsize == 2 else float(np.finfo(expected.dtype).eps)
        if expected.dtype.name == "bfloat16":
            eps = 2.0**-7
        ok = np.isclose(a, b, rtol=4 * eps * max(nranks, 1), atol=0.0) | (a == b)
        return int(ok.size - np.count_nonzero(ok))
    return int(np.count_nonzero(result != expected))
