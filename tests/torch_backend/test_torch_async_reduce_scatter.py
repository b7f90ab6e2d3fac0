"""reduce_scatter with ``async_op=True`` through torch.distributed on backend "ndist"
(both forms: ``reduce_scatter`` of a list, ``reduce_scatter_tensor``, which torch sends as
``_reduce_scatter_base``): the Work torch returns completes, its result equals the
definition, and two in flight at once complete in issue order. The op that
docs/architecture.md "Adding a collective op" was followed with, end to end."""

import pytest

torch = pytest.importorskip("torch")

from tests.torch_backend.torch_helpers import run_torch  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]


def _async_reduce_scatter(rank, n):
    import warnings

    import torch
    import torch.distributed as dist

    warnings.simplefilter("ignore", FutureWarning)
    inp = torch.arange(4.0 * n) + 100 * rank  # rank r's 4 * n elements
    big = torch.arange(3 << 14, dtype=torch.float64) * (rank + 1)  # 384 KiB: above the inline sizes
    out_t, out_l, out_b = torch.empty(4), torch.empty(4), torch.empty((3 << 14) // n, dtype=torch.float64)
    w1 = dist.reduce_scatter_tensor(out_t, inp, async_op=True)
    w2 = dist.reduce_scatter(out_l, list(inp.chunk(n)), op=dist.ReduceOp.MAX, async_op=True)
    w3 = dist.reduce_scatter_tensor(out_b, big, async_op=True)
    done = [w.wait() for w in (w3, w1, w2)]  # waited on out of order: each completes
    return out_t.tolist(), out_l.tolist(), out_b[:3].tolist(), done, w1.is_completed()


def test_async_reduce_scatter_through_torch(tmp_path):
    n = 3
    res = run_torch(_async_reduce_scatter, n, "ndist", tmp_path)
    for rank, (summed, maxed, big, done, completed) in enumerate(res):
        part = [4 * rank + i for i in range(4)]
        assert summed == [n * x + 100 * sum(range(n)) for x in part], rank
        assert maxed == [x + 100 * (n - 1) for x in part], rank
        first = rank * ((3 << 14) // n)
        assert big == [float(i * sum(range(1, n + 1))) for i in range(first, first + 3)], rank
        assert done == [True, True, True] and completed, rank
