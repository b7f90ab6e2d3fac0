"""torchft on backend "ndist": ``ndist.torch.torchft.ProcessGroupNdistFT`` through the
configure / collectives / reconfigure cycle torchft's Manager runs on every quorum change.

The store is a real ``TCPStore`` on a port the OS picks, in this test's process, which torchft
addresses as ``host:port/prefix`` (``create_store_client``), as its Manager does."""

from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchft")


from ndist.testing import run_ranks  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]


def _quorums(rank, world_size, port):
    import torch
    import torch.distributed as dist

    from ndist.collectives.backends.socket.wire._segment import job_prefix
    from ndist.runtime import _net
    from ndist.torch.torchft import ProcessGroupNdistFT

    torch.set_num_threads(1)
    pg = ProcessGroupNdistFT(timeout=timedelta(seconds=30))
    assert pg.getBackendName() == "torchft-ndist"
    seen = []

    def configure(quorum, replica_rank, replicas):
        pg.configure(f"127.0.0.1:{port}/torchft/{quorum}/0", str(rank), replica_rank, replicas, quorum_id=quorum,
                     group_rank=0, group_world_size=1)

    def allreduce(value, op=dist.ReduceOp.SUM):
        t = torch.tensor([value])
        opts = dist.AllreduceOptions()
        opts.reduceOp = op
        pg.allreduce([t], opts).wait()
        return t.item()

    # quorum 1: both replicas
    configure(1, rank, 2)
    seen.append((pg.size(), allreduce(float(rank + 1)), allreduce(rank * 3 + 4, dist.ReduceOp.AVG)))
    # quorum 2: both again, renumbered (torchft orders replicas by their id each time)
    configure(2, 1 - rank, 2)
    t = torch.tensor([float(rank)])
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    pg.broadcast([t], opts).wait()
    seen.append((pg.size(), t.item()))
    # quorum 3: replica 1 has left; replica 0 goes on alone
    if rank == 0:
        configure(3, 0, 1)
        seen.append((pg.size(), allreduce(5.0)))
    pg.shutdown()
    return job_prefix(_net.job_secret()), seen


def test_configure_allreduce_reconfigure_on_a_tcp_store(tmp_path):
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    out = run_ranks(_quorums, 2, args=(server.port,), init=False, timeout=150)
    (prefix0, seen0), (prefix1, seen1) = out
    assert seen0 == [(2, 3.0, 5), (2, 1.0), (1, 5.0)]  # int AVG: (4 + 7) / 2 toward zero
    assert seen1 == [(2, 3.0, 5), (2, 1.0)]  # quorum 2's rank 0 is replica 1: its value broadcast
    assert out.shm_left == [] and prefix0 == prefix1  # (what run_ranks found once the ranks were gone)


def test_options_are_checked():
    from ndist.torch.torchft import ProcessGroupNdistFT

    with pytest.raises(TypeError, match="options: expected ndist.torch.Options or None, got str"):
        ProcessGroupNdistFT(options="tcp")


def _replica(rank, world_size, lighthouse, kind):
    """Replica ``rank`` (a replica group of one process): torchft's Manager, DDP and optimizer
    wrappers, 4 steps; its weights and the quorums it went through."""
    import torch
    import torch.distributed as dist
    from torchft import DistributedDataParallel, Manager, Optimizer
    from torchft.process_group import ProcessGroupGloo

    from ndist.collectives.backends.socket.wire._segment import job_prefix
    from ndist.runtime import _net
    from ndist.torch.torchft import ProcessGroupNdistFT

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # the replica group's
    pg = ProcessGroupNdistFT(timeout=timedelta(seconds=30)) if kind == "ndist" else ProcessGroupGloo()
    torch.manual_seed(42)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    manager = Manager(
        pg=pg, min_replica_size=2, load_state_dict=lambda sd: model.load_state_dict(sd["model"]),
        state_dict=lambda: {"model": model.state_dict()}, replica_id=f"replica{rank}",
        store_addr="127.0.0.1", store_port=store.port, rank=0, world_size=1, lighthouse_addr=lighthouse,
        timeout=timedelta(seconds=30), quorum_timeout=timedelta(seconds=60),
    )
    try:
        ddp = DistributedDataParallel(manager, model)
        optimizer = Optimizer(manager, opt)
        gen = torch.Generator().manual_seed(rank)
        while manager.current_step() < 4:
            optimizer.zero_grad()
            x, y = torch.rand(4, 3, generator=gen), torch.randint(4, (4,), generator=gen)
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            optimizer.step()
        weights = [p.detach().clone() for p in model.parameters()]
        quorum = (manager.num_participants(), manager.current_step())
    finally:
        manager.shutdown(wait=False)
        pg.shutdown()
    return job_prefix(_net.job_secret()), weights, quorum


def _train(kind):
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=2)  # a port the OS picks
    try:
        return run_ranks(_replica, 2, args=(lighthouse.address(), kind), init=False, timeout=150)
    finally:
        lighthouse.shutdown()


def test_manager_ddp_two_replicas_weights_equal_to_gloo():
    ours, gloo = _train("ndist"), _train("gloo")
    assert ours.shm_left == []  # (what run_ranks found and removed once the ranks were gone)
    for (prefix, weights, quorum), (_, gloo_weights, _) in zip(ours, gloo):
        assert quorum == (2, 4)  # both replicas took part in every step
        for a, b, c in zip(weights, ours[0][1], gloo_weights):
            assert torch.equal(a, b)  # the replicas agree
            assert torch.equal(a, c), (a - c).abs().max()  # and agree with Gloo's, bit for bit
