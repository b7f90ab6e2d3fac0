"""A survivor blocked in a *healthy* group on a member that went into ``shrink_group`` on the
default group is released at once (issue 29).

4 ranks, subgroup [0, 1], rank 3 SIGKILLed. Ranks 0 and 2 raise ``DistRankFailureError`` on
the world and call ``shrink_group()``; rank 1 waits in an op on [0, 1] that rank 0 never
joins (the shrink destroys every other group, as torch's does). Before the fix rank 1
waited its op's timeout and ranks 0 and 2 raised ``DistTimeoutError: shrink_group ...
ranks (global) [1] neither called shrink_group nor were found lost``. Now a survivor that
begins the shrink revokes its other groups and tells every process through the member
watch: rank 1's op fails with a ``DistRankFailureError`` naming rank 3 (``failed_ranks``
[]: no member of [0, 1] is lost), rank 1 shrinks too, and the three survivors finish.

Cases: the op is the subgroup's first (no link to rank 0 yet: it waits for rank 0's
address), or the subgroup has links (an op ran on it before), or rank 1 waits in a
``recv`` from rank 0; both engines."""

import pytest

from ndist.testing import run_ranks


def _job(rank, size, how, folder):
    import os
    import signal
    import time
    from datetime import timedelta

    import numpy as np

    import ndist.distributed as dist
    from tests.kill_sync import all_past

    dist.init_process_group("socket", timeout=timedelta(seconds=15))
    try:
        x = np.ones(4, dtype=np.float32)
        dist.all_reduce(x)
        sub = dist.new_group([0, 1])
        if how != "first" and rank in (0, 1):
            dist.all_reduce(x, group=sub)  # the subgroup's links exist
        dist.barrier()
        all_past(folder, rank, 4, victim=3)
        if rank == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        out = {}
        if rank == 1:  # waits in [0, 1]; rank 0 never joins
            t0 = time.monotonic()
            try:
                if how == "recv":
                    dist.recv(np.zeros(4, dtype=np.float32), src=0, group=sub)
                else:
                    dist.all_reduce(np.ones(4, dtype=np.float32), group=sub)
                out["sub"] = "no error"
            except dist.DistError as err:
                out["sub"] = (type(err).__name__, getattr(err, "failed_ranks", None), err.rank, str(err))
            out["took"] = time.monotonic() - t0
            try:  # revoked: the next op on it fails at once too
                dist.all_reduce(np.ones(4, dtype=np.float32), group=sub)
                out["again"] = "no error"
            except dist.DistRankFailureError as err:
                out["again"] = err.rank
        else:
            try:
                while True:
                    dist.all_reduce(x)
            except dist.DistRankFailureError as err:
                out["world"] = err.failed_ranks
            if rank == 0:
                time.sleep(0.5)  # rank 1 is blocked in the subgroup by now
        t1 = time.monotonic()
        dist.shrink_group()
        y = np.full(4, float(rank + 1), dtype=np.float32)
        dist.all_reduce(y)
        out.update(shrink=time.monotonic() - t1, size=dist.get_world_size(), rank=dist.get_rank(), sum=float(y[0]),
                   sub_destroyed=sub.destroyed)
        dist.barrier()
        return out
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("engine,how", [("native", "first"), ("native", "linked"), ("python", "first"),
                                        ("python", "linked"), ("python", "recv")])
def test_a_survivor_blocked_in_a_healthy_subgroup_is_released_by_the_shrink(tmp_path, engine, how):
    res = run_ranks(_job, 4, args=(how, str(tmp_path)), init=False, timeout=90, may_die=[3], env={"NDIST_ENGINE": engine})
    assert res[3] is None
    got = res[1]
    kind, failed, named, message = got["sub"]
    assert kind == "DistRankFailureError" and failed == [] and named == 3, got
    assert "rank 3" in message and "shrink_group" in message, message
    assert got["took"] < 3.0, got  # (rank 0 goes to the shrink 0.5 s after the loss)
    assert got["again"] == 3, got
    for rank, new_rank in ((0, 0), (1, 1), (2, 2)):
        r = res[rank]
        assert r["size"] == 3 and r["rank"] == new_rank and r["sum"] == 6.0 and r["sub_destroyed"], (rank, r)
        assert r["shrink"] < 5.0, (rank, r)
    assert res[0]["world"] == [3] and res[2]["world"] == [3], res
