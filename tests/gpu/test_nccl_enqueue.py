"""The thin NCCL enqueue at world size 1: pooled events, no Work for a blocking call."""

from __future__ import annotations

import pytest

from tests.gpu._gpu import nccl_fixture, require_gpu

cp = require_gpu(nccl=True)

from ndist.collectives import ReduceOp  # noqa: E402
from ndist.collectives._backend import DONE  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]


be = nccl_fixture("gpu-enqueue")


def test_a_blocking_call_returns_done_and_its_result_is_on_the_stream(be):
    x = cp.arange(1000, dtype=cp.float32)
    assert be.all_reduce(x, ReduceOp.PREMUL_SUM, scale=2.0, blocking=True) is DONE
    cp.testing.assert_array_equal(x, cp.arange(1000, dtype=cp.float32) * 2)
    assert be.backend._watchdog.pending() == []  # no Work was made


def test_events_are_reused_across_many_calls(be):
    x = cp.ones(1024, dtype=cp.float32)
    for i in range(3000):
        be.all_reduce(x, ReduceOp.SUM, blocking=True)
        if i % 500 == 0:
            cp.cuda.get_current_stream().synchronize()
    works = [be.all_reduce(x, ReduceOp.SUM) for _ in range(200)]
    cp.cuda.get_current_stream().synchronize()
    for w in works:
        assert w.wait(30) is True and w.is_completed()
    # each event goes back once the watchdog saw it fire: far fewer than one per call
    assert be.backend._events.made < 1000, be.backend._events.made


def test_the_public_api_returns_after_the_enqueue():
    import ndist.distributed as dist
    from ndist.runtime import HashStore

    dist.init_process_group("nccl", store=HashStore(), rank=0, world_size=1)
    try:
        x = cp.full(256, 3.0, dtype=cp.float32)
        assert dist.all_reduce(x) is None
        w = dist.all_reduce(x, async_op=True)
        assert w.wait() is True
        cp.cuda.get_current_stream().synchronize()
        cp.testing.assert_array_equal(x, cp.full(256, 3.0, dtype=cp.float32))
    finally:
        dist.destroy_process_group()
