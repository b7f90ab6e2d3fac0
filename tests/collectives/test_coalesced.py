"""torch 2.13's all_gather_single / reduce_scatter_single and the coalesced
collectives (issue #15: missing from ndist.distributed)."""

import numpy as np
import pytest

import ndist
from ndist.testing import run_ranks


def _single(rank, ws):
    import ndist.distributed as dist

    out = np.zeros(2 * ws, np.int64)
    dist.all_gather_single(out, np.arange(2, dtype=np.int64) + 1 + 2 * rank)
    rs = np.zeros(2, np.int64)
    w = dist.reduce_scatter_single(rs, np.arange(2 * ws, dtype=np.int64), async_op=True)
    w.wait()
    return out.tolist(), rs.tolist()


@pytest.mark.timeout(90)
def test_single_names():
    out = run_ranks(_single, 2, timeout=60)
    assert out == [([1, 2, 3, 4], [0, 2]), ([1, 2, 3, 4], [4, 6])]


def _coalesced(rank, ws, async_op):
    import ndist.distributed as dist

    ts = [ndist.tensor([1.0 + rank, 2.0]), ndist.tensor([[10.0 * rank]])]
    res = dist.all_reduce_coalesced(ts, group=None, async_op=async_op)
    info = {}
    if async_op:
        info["type"] = type(res).__name__
        info["value_is_tensors"] = all(a is b for a, b in zip(res.wait(), ts))
    else:
        info["ret"] = res
    info["sums"] = [t.tolist() for t in ts]
    c = ndist.tensor([1.0 + 1j * rank])
    dist.all_reduce_coalesced([c])
    info["complex"] = c.tolist()
    # torch's docstring example (2 ranks)
    if rank == 0:
        inputs = [ndist.tensor([[1, 1], [1, 1]]), ndist.tensor([2]), ndist.tensor([3, 3])]
    else:
        inputs = [ndist.tensor([[3, 3], [3, 3]]), ndist.tensor([5]), ndist.tensor([1, 1])]
    outs = [[ndist.full((2, 2), -1), ndist.full((1,), -1), ndist.full((2,), -1)] for _ in range(ws)]
    res = dist.all_gather_coalesced(outs, inputs, async_op=async_op)
    if async_op:
        res.wait()
    info["gathered"] = [[t.tolist() for t in row] for row in outs]
    # bad input raises before anything is sent; the group stays usable
    errors = []
    for bad in (lambda: dist.all_reduce_coalesced([ndist.ones(2), ndist.ones(2, dtype=ndist.int64)]),
                lambda: dist.all_reduce_coalesced([ndist.ones(2), "x"]),
                lambda: dist.all_gather_coalesced([[ndist.ones(1)]], [ndist.ones(1)]),
                lambda: dist.all_gather_coalesced([[ndist.ones(1)], [ndist.ones(1, dtype=ndist.int64)]], [ndist.ones(1)])):
        try:
            bad()
        except (TypeError, ValueError) as err:
            errors.append(str(err).split(":")[0])
    info["errors"] = errors
    t = ndist.ones(1)
    dist.all_reduce_coalesced(t)
    info["after"] = t.tolist()
    return info


@pytest.mark.timeout(120)
@pytest.mark.parametrize("async_op", [False, True])
def test_all_reduce_and_all_gather_coalesced(async_op):
    out = run_ranks(_coalesced, 2, args=(async_op,), timeout=90)
    for r, o in enumerate(out):
        assert o["sums"] == [[3.0, 4.0], [[10.0]]] and o["complex"] == [2 + 1j]
        if async_op:
            assert o["type"] == "Future" and o["value_is_tensors"]
        else:
            assert o["ret"] is None
        assert o["gathered"] == [[[[1, 1], [1, 1]], [2], [3, 3]], [[[3, 3], [3, 3]], [5], [1, 1]]]
        assert o["errors"] == ["tensors[1]", "tensors[1]", "output_tensor_lists", "output_tensor_lists[1][0]"]
        assert o["after"] == [2.0]
