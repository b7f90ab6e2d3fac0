"""A member lost during the agreement, that posted what it saw before it went, is not taken
for an alive member excluded by request when a survivor learns of its loss from another
survivor's post before its own watch tells it. Found by the ``--on-failure continue`` kill
trials (tools/trials/kill_trials.py, seed 309, n = 8: every survivor raised ``ValueError:
ranks_to_exclude: expected ranks that are lost, got ranks [2] ..., which are alive and called
shrink_group``). Each survivor now posts, beside the ranks it would exclude, the ranks it
knows are lost (its own member watch's record, and what other survivors posted as lost);
only a rank nobody knows lost counts as alive."""

import pytest

from ndist.testing import run_ranks


def _job(rank, size):
    import os
    import signal
    import threading
    import time

    import numpy as np

    import ndist.distributed as dist
    import ndist.runtime._shrink as shrink
    from ndist.runtime._world import _world
    from tests.reliability.shrink_scenarios import Api, lose

    lose(Api("ndist"), rank, size, 3)
    if rank == 1:  # its own watch tells it of rank 2's loss only 1 s late
        watch = _world.watch
        told = watch.on_loss

        def late(job_rank, *a):
            if job_rank == 2:
                threading.Timer(1.0, told, (job_rank, *a)).start()
            else:
                told(job_rank, *a)

        watch.on_loss = late
        time.sleep(0.5)  # it comes to the agreement last: rank 0 has posted rank 2's loss by then
    if rank == 2:  # lost during the agreement, right after it posted what it saw
        class DyingStore(shrink.PrefixStore):
            def set(self, key, value):
                super().set(key, value)
                if key.startswith("seen/"):
                    os.kill(os.getpid(), signal.SIGKILL)

        shrink.PrefixStore = DyingStore
    try:
        dist.shrink_group()
    except ValueError as err:
        return f"refused: {err}"
    while True:  # a survivor that learns of rank 2 only on the shrunk group shrinks that one
        y = np.full(4, float(rank + 1), dtype=np.float32)
        try:
            dist.all_reduce(y)
            return dist.get_world_size(), float(y[0])
        except dist.DistRankFailureError:
            dist.shrink_group()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("engine", ["native", "python"])
def test_a_loss_learnt_from_another_survivor_is_not_taken_for_an_alive_rank(engine):
    res = run_ranks(_job, 4, timeout=90, may_die=[2, 3], env={"NDIST_ENGINE": engine})
    assert res[0] == (2, 3.0) and res[1] == (2, 3.0), res
