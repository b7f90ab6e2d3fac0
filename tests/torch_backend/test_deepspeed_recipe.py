"""DeepSpeed on backend "ndist": ``deepspeed.init_distributed(dist_backend="ndist")``, the ops of
``deepspeed.comm`` and ZeRO stages 1, 2 and 3 on DeepSpeed's CPU accelerator, against Gloo.

Each rank makes the group itself, as a user's script does (through a FileStore: no port), with
``DS_ACCELERATOR=cpu`` and the ``LOCAL_RANK`` DeepSpeed's engine asks for. DeepSpeed's
``TorchBackend`` compiles its shared-memory op (``deepspeed_shm_comm``) on the first
``init_distributed`` into ``TORCH_EXTENSIONS_DIR``: once per test run (tests/conftest.py)."""

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")


from ndist.testing import run_ranks  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(600)]


def _deepspeed(rank, world_size, path, backend):
    os.environ["LOCAL_RANK"] = str(rank)  # what deepspeed's, torch's and ndist's launchers set
    import deepspeed
    import deepspeed.comm as ds_comm
    import torch

    import ndist.torch  # noqa: F401 - registers "ndist"
    from ndist.collectives.backends.socket.wire._segment import job_prefix
    from ndist.runtime import _net

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend=backend, init_method=f"file://{path}", rank=rank,
                               world_size=world_size, auto_mpi_discovery=False, verbose=False)
    assert torch.distributed.get_backend() == backend
    ops = {}
    t = torch.arange(6, dtype=torch.float32) * (rank + 1) + 0.1
    ds_comm.all_reduce(t)
    ops["all_reduce"] = t
    t = torch.arange(6, dtype=torch.float32) * (rank + 1)
    ds_comm.all_reduce(t, op=ds_comm.ReduceOp.MAX)
    ops["all_reduce max"] = t
    out = torch.empty(6 * world_size)
    ds_comm.all_gather_into_tensor(out, torch.full((6,), rank + 0.5))
    ops["all_gather_into_tensor"] = out
    out = torch.empty(3)
    ds_comm.reduce_scatter_tensor(out, torch.arange(3.0 * world_size) + rank)
    ops["reduce_scatter_tensor"] = out
    t = torch.full((4,), float(rank))
    ds_comm.broadcast(t, src=1)
    ops["broadcast"] = t
    out = torch.empty(2 * world_size)
    ds_comm.all_to_all_single(out, torch.arange(2.0 * world_size) + 10 * rank)
    ops["all_to_all_single"] = out
    ds_comm.barrier()

    weights = {}
    for stage in (1, 2, 3):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage},
                  "zero_allow_untested_optimizer": True}  # a torch optimizer: DeepSpeed's own Adam needs its ops
        engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                          config=config)
        gen = torch.Generator().manual_seed(rank)
        for _ in range(3):
            x, y = torch.randn(2, 4, generator=gen), torch.randn(2, 2, generator=gen)
            engine.backward(torch.nn.functional.mse_loss(engine(x), y))
            engine.step()
        with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):  # stage 3 partitions them
            weights[stage] = [p.detach().clone() for p in engine.module.parameters()]
        engine.destroy()
    ds_comm.destroy_process_group()
    return job_prefix(_net.job_secret()), ops, weights


def test_comm_ops_and_zero_1_2_3_on_ndist_equal_gloo(tmp_path):
    env = {"DS_ACCELERATOR": "cpu"}
    ours = run_ranks(_deepspeed, 2, args=(str(tmp_path / "ndist"), "ndist"), init=False, timeout=540, env=env)
    gloo = run_ranks(_deepspeed, 2, args=(str(tmp_path / "gloo"), "gloo"), init=False, timeout=300, env=env)
    assert ours.shm_left == []  # (what run_ranks found and removed once the ranks were gone)
    torch.manual_seed(0)
    first = torch.nn.Linear(4, 8)  # the model's first layer before training
    for (prefix, ops, weights), (_, gloo_ops, gloo_weights) in zip(ours, gloo):
        assert ops.keys() == gloo_ops.keys()
        for name, t in ops.items():
            assert torch.equal(t, gloo_ops[name]), (name, t, gloo_ops[name])
        assert ops["broadcast"].tolist() == [1.0] * 4
        for stage in (1, 2, 3):
            for a, b, c in zip(weights[stage], ours[0][2][stage], gloo_weights[stage]):
                assert torch.equal(a, b), stage  # the ranks agree
                assert torch.equal(a, c), (stage, (a - c).abs().max())  # and agree with Gloo's, bit for bit
            assert not torch.equal(weights[stage][0], first.weight)  # the steps trained it
