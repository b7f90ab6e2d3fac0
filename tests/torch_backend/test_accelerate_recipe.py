"""accelerate on backend "ndist": the group is made before the ``Accelerator`` (accelerate takes
only "gloo" or "mpi" for a CPU group it makes itself), which then uses the initialised group.
``accelerator.reduce``, ``accelerator.gather`` and DDP training through ``accelerator.prepare``
against Gloo, on 2 CPU processes that ``run_torch`` started."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

from tests.torch_backend.torch_helpers import run_torch  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]


def _accelerate(rank, world_size):
    import torch
    import torch.distributed as dist
    from accelerate import Accelerator, DistributedType
    from torch.utils.data import DataLoader, TensorDataset

    accelerator = Accelerator(cpu=True)
    assert (accelerator.num_processes, accelerator.process_index) == (world_size, rank)
    assert accelerator.distributed_type == DistributedType.MULTI_CPU
    # accelerate's own label says "gloo" (the backend it would have made), whatever the group's is
    assert accelerator.state.backend == "gloo"
    backend = dist.get_backend()  # the group made before it, which accelerate uses
    reduced = accelerator.reduce(torch.arange(4.0) * (rank + 1) + 0.1, reduction="sum")
    mean = accelerator.reduce(torch.arange(4.0) * (rank + 1), reduction="mean")
    gathered = accelerator.gather(torch.full((2,), rank + 0.5))

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(16, 4, generator=gen), torch.randn(16, 2, generator=gen))
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=2))
    assert isinstance(model, torch.nn.parallel.DistributedDataParallel)
    for x, y in loader:  # 4 steps: accelerate's sampler gives each rank 8 of the 16 samples
        optimizer.zero_grad()
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
    weights = [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()]
    return backend, reduced, mean, gathered, weights


def test_reduce_gather_and_ddp_training_on_ndist_equal_gloo(tmp_path):
    ours = run_torch(_accelerate, 2, "ndist", tmp_path, timeout=240)
    gloo = run_torch(_accelerate, 2, "gloo", tmp_path, timeout=240)
    torch.manual_seed(0)
    first = torch.nn.Linear(4, 8)  # the model's first layer before training
    for rank in range(2):
        backend, reduced, mean, gathered, weights = ours[rank]
        _, g_reduced, g_mean, g_gathered, g_weights = gloo[rank]
        assert backend == "ndist"
        assert torch.equal(reduced, g_reduced) and torch.equal(mean, g_mean), (reduced, g_reduced, mean, g_mean)
        assert gathered.tolist() == g_gathered.tolist() == [0.5, 0.5, 1.5, 1.5]
        assert not torch.equal(weights[0], first.weight)  # the steps trained it
        for a, b, c in zip(weights, ours[0][4], g_weights):
            assert torch.equal(a, b)  # the ranks agree
            assert torch.equal(a, c), (a - c).abs().max()  # and agree with Gloo's, bit for bit
