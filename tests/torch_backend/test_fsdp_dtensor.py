"""FSDP2 (``fully_shard``) and DTensor tensor parallelism on backend "ndist", against Gloo, at 2
ranks, on the compiled backend (built once per run: tests/conftest.py), on every supported
torch release. One rank body runs both (one start of torch per
backend): FSDP2's all-gathers and reduce-scatters (async, with its own streams of work) and
DTensor's functional collectives (``ColwiseParallel`` / ``RowwiseParallel``, the all-reduce of
the row-parallel layer and the redistributions of its gradients)."""

import pytest

torch = pytest.importorskip("torch")

from tests.torch_backend.torch_helpers import run_torch  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.every_torch_release, pytest.mark.timeout(300)]


def _mlp():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))


def _fsdp_and_dtensor(rank, world):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import ndist.torch.ops as ops

    out = {}
    mesh = init_device_mesh("cpu", (world,))
    # FSDP2: every parameter sharded over the ranks, 3 SGD steps on different data per rank
    model = _mlp()
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 16, generator=gen)).pow(2).mean().backward()
        opt.step()
    out["fsdp"] = [p.full_tensor().detach().clone() for p in model.parameters()]
    # DTensor tensor parallel: column- then row-parallel linear layers, the same input everywhere
    tp = parallelize_module(_mlp(), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(7))
    y = tp(x)
    y.pow(2).sum().backward()
    out["tp-out"] = y.detach().clone()
    out["tp-grad"] = [p.grad.full_tensor().detach().clone() for p in tp.parameters()]
    return out, ops.engine_calls()


def test_fsdp2_and_dtensor_equal_gloo(tmp_path, torch_compiled_build, monkeypatch):
    """Bitwise equal to Gloo (2 ranks: a sum of two is the same in any order), on the compiled
    backend (``engine_calls`` >= 0)."""
    monkeypatch.setenv("NDIST_TORCH_COMPILED", "1")
    ours = run_torch(_fsdp_and_dtensor, 2, "ndist", tmp_path, timeout=240)
    gloo = run_torch(_fsdp_and_dtensor, 2, "gloo", tmp_path, timeout=240)
    for rank in range(2):
        (results, calls), (expected, _) = ours[rank], gloo[rank]
        assert calls >= 0, "backend 'ndist' ran on the Python backend, not the compiled one"
        for key, value in expected.items():
            got = results[key]
            if isinstance(value, list):
                assert len(got) == len(value) and all(torch.equal(a, b) for a, b in zip(got, value)), (rank, key)
            else:
                assert torch.equal(got, value), (rank, key)
        assert all(torch.equal(a, b) for a, b in zip(results["fsdp"], ours[0][0]["fsdp"])), rank
