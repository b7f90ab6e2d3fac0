"""``ndist.torch.get_failed_ranks`` after a member died but before the member watch has told
its loss: it waits for the watch's verdict (the lost member's watch connection has closed),
longer than an op's 1 s, rather than answer ``[]``, which ``shrink_group`` refuses."""

import os
import signal

import pytest

torch = pytest.importorskip("torch")

from ndist.testing import run_ranks  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]

_TELL_LATE_S = 2.5  # the watch tells the loss this late: past an op's verdict wait (1 s)


def _slow_verdict(rank, size):
    import time
    from datetime import timedelta

    import torch.distributed as dist

    import ndist.torch
    from ndist.torch import _watch
    from tests.kill_sync import all_past

    torch.set_num_threads(1)
    dist.init_process_group("ndist", init_method="ndist://", timeout=timedelta(seconds=60))
    me = dist.get_rank()
    watch = _watch._job.watch
    told = watch.on_loss

    def late(*args, **kwargs):  # (on the watch's thread: the loss is told _TELL_LATE_S late)
        time.sleep(_TELL_LATE_S)
        return told(*args, **kwargs)

    watch.on_loss = late
    dist.barrier()
    all_past(dist.distributed_c10d._get_default_store(), me, size, victim=2)
    if me == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        dist.all_reduce(torch.ones(2))
        raised = "nothing"
    except dist.DistNetworkError as err:
        raised = type(err).__name__
    failed = ndist.torch.get_failed_ranks()
    new = dist.shrink_group(failed)
    x = torch.tensor([float(me + 1)])
    dist.all_reduce(x, group=new)
    dist.destroy_process_group()
    return raised, failed, x.item()


def test_get_failed_ranks_waits_for_a_verdict_the_watch_tells_late():
    """(On the default backend: get_failed_ranks reads the Python group under either.)"""
    res = run_ranks(_slow_verdict, 3, init=False, timeout=90, may_die=[2])
    assert res[2] is None, res
    for rank in (0, 1):
        assert res[rank] == ("DistNetworkError", [2], 3.0), res
