"""Byte counts, bus-bandwidth factors (nccl-tests' definitions) and result checking."""

import importlib.util

import numpy as np
import pytest

from ndist.bench import OPS, bandwidths, layout
from ndist.bench._ops import count_wrong, make_buffers, resolve_dtype

pytestmark = pytest.mark.timeout(60)

# nccl-tests doc/PERFORMANCE.md "Summary" and src/{gather,scatter,sendrecv}.cu
NCCL_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}


@pytest.mark.parametrize("op", sorted(NCCL_FACTORS))
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_busbw_factor_matches_nccl_tests(op, n):
    lay = layout(op, 1 << 20, 4, n)
    algbw, busbw = bandwidths(op, lay.size, 1e-3, n)
    assert algbw == pytest.approx(lay.size / 1e9 / 1e-3)
    assert busbw == pytest.approx(algbw * NCCL_FACTORS[op](n))


def test_busbw_known_values():
    # 16 MiB all_reduce in 10 ms on 4 ranks: algbw 1.678 GB/s, busbw x 1.5
    algbw, busbw = bandwidths("all_reduce", 16 << 20, 0.01, 4)
    assert algbw == pytest.approx(1.6777216)
    assert busbw == pytest.approx(2.5165824)
    assert bandwidths("barrier", 0, 1e-5, 4) == (0.0, 0.0)
    assert bandwidths("all_reduce", 8, 0.0, 4) == (0.0, 0.0)


@pytest.mark.parametrize(
    "op, expected",  # (count, send, recv, size) for 1000 B of float32 on 3 ranks, as nccl-tests splits it
    [
        ("all_reduce", (250, 250, 0, 1000)),
        ("broadcast", (250, 250, 0, 1000)),
        ("reduce", (250, 250, 0, 1000)),
        ("sendrecv", (250, 250, 250, 1000)),
        ("all_gather", (83, 83, 249, 996)),
        ("gather", (83, 83, 249, 996)),
        ("reduce_scatter", (83, 249, 83, 996)),
        ("scatter", (83, 249, 83, 996)),
        ("all_to_all", (83, 249, 249, 996)),
        ("barrier", (0, 0, 0, 0)),
    ],
)
def test_layout(op, expected):
    lay = layout(op, 1000, 4, 3)
    assert (lay.count, lay.send, lay.recv, lay.size) == expected


def test_every_op_has_a_layout_and_factor():
    assert set(OPS) == set(NCCL_FACTORS) | {"barrier"}


# ---------------------------------------------------------------- checking


def _reference(op, inputs, redop, root, n):
    """What each rank holds after ``op``, computed the obvious way."""
    ufunc = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[redop]

    def reduce_all(arrs):
        out = arrs[0].copy()
        for a in arrs[1:]:
            ufunc(out, a, out=out)
        if redop == "avg":
            if out.dtype.kind in "iu":  # truncating toward zero, as ndist's AVG on integers
                return np.array([int(int(v) / n) for v in out], out.dtype)
            out /= n
        return out

    if op in ("all_reduce",):
        return [reduce_all(inputs)] * n
    if op == "reduce":
        return [reduce_all(inputs) if r == root else None for r in range(n)]
    if op == "broadcast":
        return [inputs[root]] * n
    if op == "all_gather":
        return [np.concatenate(inputs)] * n
    if op == "gather":
        return [np.concatenate(inputs) if r == root else None for r in range(n)]
    if op == "reduce_scatter":
        return np.split(reduce_all(inputs), n)
    if op == "scatter":
        return np.split(inputs[root], n)
    if op == "all_to_all":
        return [np.concatenate([np.split(inputs[j], n)[r] for j in range(n)]) for r in range(n)]
    if op == "sendrecv":
        return [inputs[(r - 1) % n] for r in range(n)]
    raise AssertionError(op)


@pytest.mark.parametrize("op", [o for o in OPS if o != "barrier"])
@pytest.mark.parametrize("dtype, redop", [
    ("float32", "sum"), ("int8", "prod"),
    pytest.param("bfloat16", "max", marks=pytest.mark.skipif(
        importlib.util.find_spec("ml_dtypes") is None, reason="bfloat16 needs ml_dtypes")),
    ("float16", "avg"), ("uint64", "min"), ("float64", "prod"), ("int32", "avg"), ("uint8", "avg")])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_expected_matches_reference(op, dtype, redop, n):
    dt = resolve_dtype(dtype)
    lay = layout(op, 4096, dt.itemsize, n)
    root = n - 1
    bufs = [make_buffers(op, lay, dt, r, n, root, redop) for r in range(n)]
    inputs = [b.send.copy() for b in bufs]
    ref = _reference(op, inputs, redop, root, n)
    for r, b in enumerate(bufs):
        if b.expected is None:
            assert ref[r] is None
            continue
        assert count_wrong(ref[r], b.expected, n) == 0
        assert b.result.shape == b.expected.shape
    # before the op, the result buffers are not what is expected (an op that does nothing is caught)
    assert sum(count_wrong(b.result, b.expected, n) for b in bufs) > 0


def test_misplaced_chunks_are_wrong():
    n, dt = 4, np.dtype("float32")
    lay = layout("all_gather", 4096, 4, n)
    b = make_buffers("all_gather", lay, dt, 0, n, 0, "sum")
    swapped = np.concatenate(np.split(b.expected, n)[::-1])
    assert count_wrong(swapped, b.expected, n) == b.expected.size
    lay = layout("sendrecv", 4096, 4, n)
    b = make_buffers("sendrecv", lay, dt, 1, n, 0, "sum")
    from_wrong_peer = make_buffers("sendrecv", lay, dt, 2, n, 0, "sum").send
    assert count_wrong(from_wrong_peer, b.expected, n) > lay.count // 2


def test_count_wrong():
    e = np.arange(10, dtype=np.int32)
    r = e.copy()
    r[[1, 7]] = -1
    assert count_wrong(r, e, 2) == 2
    assert count_wrong(None, e, 2) == 10
    assert count_wrong(e[:5], e, 2) == 10
    assert count_wrong(e, None, 2) == 0
    f = np.array([1.0, 2.0, 3.0], np.float32)
    assert count_wrong(f * (1 + 1e-7), f, 2) == 0  # rounding is not an error
    assert count_wrong(f + 0.01, f, 2) == 3


def test_bfloat16_without_ml_dtypes_is_a_clear_error():
    if importlib.util.find_spec("ml_dtypes") is not None:
        assert resolve_dtype("bfloat16").itemsize == 2
    else:
        with pytest.raises(ValueError, match="bfloat16 needs the ml_dtypes package"):
            resolve_dtype("bfloat16")
