"""``ndist.torch.make_process_group``: a backend-"ndist" group from (store, rank, world_size,
timeout), outside torch's world, as torchft builds one on every reconfiguration."""

import os
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")


from ndist.testing import run_ranks  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]


def _group_life(rank, world_size, path):
    import torch
    import torch.distributed as dist

    from ndist.collectives.backends.socket.wire._segment import job_prefix
    from ndist.runtime import _net
    from ndist.torch import ProcessGroupNdist, make_process_group

    torch.set_num_threads(1)
    store = dist.FileStore(path, world_size)
    # no torch group exists, and none is made: this one is not torch's default group
    pg = make_process_group(dist.PrefixStore("quorum-1", store), rank, world_size, timedelta(seconds=30))
    assert isinstance(pg, dist.ProcessGroup) and isinstance(pg, ProcessGroupNdist)
    assert (pg.rank(), pg.size(), pg.getBackendName(), dist.is_initialized()) == (rank, world_size, "ndist", False)
    t = torch.full((3,), float(rank + 1))
    pg.allreduce([t]).wait()
    first = t.tolist()
    b = torch.tensor([rank * 10, -7 + rank])
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.AVG
    pg.allreduce([b], opts).wait()
    avg = b.tolist()
    # a reconfiguration: the old group aborted, a new one on the next quorum's store with
    # the ranks in the other order
    pg.abort()
    again = make_process_group(dist.PrefixStore("quorum-2", store), world_size - 1 - rank, world_size,
                               timedelta(seconds=30))
    t = torch.tensor([float(again.rank())])
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    again.broadcast([t], opts).wait()
    second = (again.rank(), t.tolist())
    again.shutdown()
    return job_prefix(_net.job_secret()), first, avg, second


def test_a_group_from_store_rank_size_timeout_and_another_after_it(tmp_path):
    path = os.path.join(str(tmp_path), "store")
    out = run_ranks(_group_life, 2, args=(path,), init=False, timeout=120)
    assert out.shm_left == []  # (what run_ranks found and removed once the ranks were gone)
    for rank, (prefix, first, avg, second) in enumerate(out):
        assert first == [3.0, 3.0, 3.0]
        assert avg == [5, -6]  # int64 AVG: (0 + 10) / 2, (-7 + -6) / 2 toward zero
        assert second == (1 - rank, [0.0])  # rank 1 is the new group's rank 0, the root


@pytest.mark.parametrize("kwargs,exc,message", [
    (dict(store="host:1"), TypeError, "store: expected a torch.distributed.Store, got str"),
    (dict(rank=2), ValueError, r"rank: expected an int in \[0, 2\), got 2"),
    (dict(rank=True), TypeError, r"rank: expected an int, got bool \(True\)"),
    (dict(world_size=0), ValueError, "world_size: expected an int >= 1, got 0"),
    (dict(timeout=30), TypeError, r"timeout: expected a datetime.timedelta, got int \(30\)"),
    (dict(timeout=timedelta(0)), ValueError, "timeout: expected a positive timedelta, got 0:00:00"),
    (dict(options="tcp"), TypeError, "options: expected ndist.torch.Options or None, got str"),
    (dict(group_name=""), ValueError, "group_name: expected a non-empty str, got ''"),
])
def test_bad_arguments_raise_before_the_store_is_used(kwargs, exc, message):
    import torch.distributed as dist

    from ndist.torch import make_process_group

    store = dist.HashStore()
    args = dict(store=store, rank=0, world_size=2, timeout=timedelta(seconds=5))
    args.update(kwargs)
    with pytest.raises(exc, match=message):
        make_process_group(**args)
    assert store.num_keys() == 0  # nothing written (a HashStore counts no init key)
