"""A group made after a member told this process it began ``shrink_group`` on the default
group is revoked from the start (issue 29; continue kill trial seed 100118).

That member is in the shrink, which destroys every other group, and never joins the new
group's ops. Before, the notice revoked only the groups that existed when it came: in trial
100118 (n=8, rank 0 killed at the start) rank 5 began the shrink before ranks 4, 6 and 7 had
made subgroup [4, 5, 6, 7]; their first op on it waited the whole group timeout for rank 5's
address, while rank 5's shrink waited for them, and the job split in two.

3 ranks: rank 2 is SIGKILLed; rank 0 sees it go and calls ``shrink_group()``; rank 1 makes
a group with rank 0 only after rank 0's notice came (``new_group`` or ``split_group``), and
its first op on it raises the ``DistRankFailureError`` naming rank 2 at once, not
``DistTimeoutError`` after the 10 s group timeout; then both shrink and carry on."""

import pytest

from ndist.testing import run_ranks

_TIMEOUT_S = 10.0


def _job(rank, size, make, folder):
    import os
    import signal
    import time
    from datetime import timedelta

    import numpy as np

    import ndist.distributed as dist
    from ndist.runtime._world import _world
    from tests.kill_sync import all_past

    dist.init_process_group("socket", timeout=timedelta(seconds=_TIMEOUT_S))
    try:
        store = _world.job_store
        dist.barrier()
        all_past(folder, rank, 3, victim=2)
        if rank == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        out = {}
        deadline = time.monotonic() + 30
        while 2 not in dist.get_failed_ranks():  # the member watch saw it go
            assert time.monotonic() < deadline, "rank 2's loss was never seen"
            time.sleep(0.01)
        if rank == 0:
            store.set("notice/shrinking", "1")
        else:
            store.wait(["notice/shrinking"])
            time.sleep(1.0)  # rank 0's notice (on the member watch) came meanwhile
            g = dist.new_group([0, 1]) if make == "new_group" else dist.split_group(split_ranks=[[0, 1]])
            t0 = time.monotonic()
            try:
                dist.all_reduce(np.ones(4, dtype=np.float32), group=g)
                out["sub"] = "no error"
            except dist.DistError as err:
                out["sub"] = (type(err).__name__, err.rank, str(err))
            out["took"] = time.monotonic() - t0
        dist.shrink_group()
        y = np.full(4, float(rank + 1), dtype=np.float32)
        dist.all_reduce(y)
        out.update(size=dist.get_world_size(), sum=float(y[0]))
        dist.barrier()
        return out
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("make", ["new_group", "split_group"])
@pytest.mark.parametrize("transport, engine", [("tcp", "python"), ("auto", "native")])
def test_a_group_made_after_a_members_shrink_notice_is_revoked_from_the_start(tmp_path, make, transport, engine):
    res = run_ranks(_job, 3, args=(make, str(tmp_path)), init=False, timeout=90, may_die=[2], transport=transport,
                    env={"NDIST_ENGINE": engine})
    assert res[2] is None
    kind, named, message = res[1]["sub"]
    assert kind == "DistRankFailureError" and named == 2, res[1]
    assert "rank 0" in message and "shrink_group" in message, message
    assert res[1]["took"] < 3.0, res[1]  # (the group timeout is 10 s)
    for rank in (0, 1):
        assert res[rank]["size"] == 2 and res[rank]["sum"] == 3.0, (rank, res[rank])
