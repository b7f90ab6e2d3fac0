"""DDP on backend "ndist": the same parameters as on Gloo after 5 SGD steps."""

import os
import shutil

import pytest

torch = pytest.importorskip("torch")

from tests.torch_backend.torch_helpers import run_torch_and_gloo  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]


def _train(rank, world_size, steps):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(100 + rank)  # different on every rank: DDP's initial broadcast must fix that
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4),
    )
    calls = _count_allreduce()
    ddp = DDP(model, bucket_cap_mb=0.004)  # ~4 KB buckets: several per backward (from step 2)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        calls.clear()
        before = _engine_calls()
        x = torch.randn(8, 16, generator=gen)
        y = torch.randn(8, 4, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()], len(calls) + _engine_calls() - before, _engine_calls(raw=True)


def _engine_calls(raw=False):
    """The all-reduces the compiled backend ran through the engine, not through ``ProcessGroupNdist``
    (docs/torch.md, "The compiled backend"): 0 on the Python backend (``raw``: -1 there)."""
    import torch.distributed as dist

    if dist.get_backend() != "ndist":
        return 0
    from ndist.torch.ops import engine_calls

    return engine_calls() if raw else max(engine_calls(), 0)


def _count_allreduce():
    """The all-reduces DDP's reducer sends to backend "ndist" (one per bucket)."""
    import torch.distributed as dist

    from ndist.torch import ProcessGroupNdist

    calls = []
    if dist.get_backend() == "ndist":
        original = ProcessGroupNdist.allreduce

        def counted(self, tensors, opts=None):
            calls.append(tensors[0].numel())
            return original(self, tensors, opts)

        ProcessGroupNdist.allreduce = counted
    return calls


def _params(tmp_path, n):
    """The trained parameters on "ndist" and on Gloo (one job)."""
    return run_torch_and_gloo(_train, n, tmp_path, args=(5,), timeout=240)


@pytest.mark.every_torch_release
def test_ddp_two_ranks_bitwise_equal_to_gloo(tmp_path):
    """On the default backend: the compiled one, unless $NDIST_TORCH_COMPILED=0 asks for the
    Python one or no C++ compiler builds it (docs/torch.md, "The compiled backend")."""
    ours, gloo = _params(tmp_path, 2)
    compiled = (os.environ.get("NDIST_TORCH_COMPILED", "auto").strip() != "0"
                and shutil.which(os.environ.get("CXX", "c++")) is not None)
    for rank in range(2):
        # the compiled backend served (DDP's buckets: async, the Python lane); -1: the Python backend
        assert (ours[rank][2] >= 0) == compiled, ours[rank][2]
        assert len(ours[rank][0]) == 8
        assert ours[rank][1] >= 3, ours[rank][1]  # several gradient buckets in the last step
        for a, b in zip(ours[rank][0], gloo[rank][0]):
            assert torch.equal(a, b), (a - b).abs().max()
    for a, b in zip(ours[0][0], ours[1][0]):
        assert torch.equal(a, b)


def test_ddp_four_ranks_close_to_gloo_and_equal_across_ranks(tmp_path):
    ours, gloo = _params(tmp_path, 4)
    for rank in range(4):
        for a, b in zip(ours[rank][0], gloo[rank][0]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        for a, b in zip(ours[rank][0], ours[0][0]):
            assert torch.equal(a, b)
