"""An operation that finds a member gone before the member watch has told the group (its
verdict comes a moment later) raises the group's ``DistRankFailureError`` naming the lost
rank and how it went, not the backend's plain ``DistNetworkError``. Found by the
``--on-failure continue`` kill trials (tools/trials/kill_trials.py, seeds 20119 and 20124: a
survivor's send saw the peer's stream end first; seed 20071: a survivor's first collective
on the shrunk group found the dead member's native file gone, gave up, and the survivors
ended in different groups). Here the survivors' watch is made slow on purpose (its
``on_loss`` sleeps 0.8 s before telling the groups, as a descheduled watch thread would),
and the victim dies after it made its backend of a new group, before the survivors' first
collective on that group: their set-up finds it gone."""

import pytest

from ndist.testing import run_ranks


def _job(rank, size):
    import os
    import signal
    import time

    import numpy as np

    import ndist.distributed as dist
    from ndist.runtime._world import _world

    watch = _world.watch
    told = watch.on_loss

    def slow(*a):
        time.sleep(0.8)
        told(*a)

    watch.on_loss = slow
    dist.barrier()
    g = dist.new_group([0, 1, 2])
    store = _world.job_store
    if rank == 2:
        g.backend_for("cpu")  # its mesh, files and address published, as a member mid-set-up
        store.set("ctfix/dying", "1")
        os.kill(os.getpid(), signal.SIGKILL)
    store.wait(["ctfix/dying"])
    time.sleep(0.1)  # (dead by now; the watch tells the groups only 0.8 s after it saw it)
    x = np.ones(8, dtype=np.float32)
    t0 = time.monotonic()
    try:
        dist.all_reduce(x, group=g)
        got = ("no error",)
    except dist.DistError as err:
        got = (type(err).__name__, getattr(err, "failed_ranks", None))
    took = time.monotonic() - t0
    time.sleep(1.0)  # (a survivor leaving early would be a loss too, for the other)
    return got, took


@pytest.mark.timeout(120)
@pytest.mark.parametrize("engine", ["native", "python"])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_loss_found_before_the_watch_told_raises_the_rank_failure(engine, transport):
    res = run_ranks(_job, 3, timeout=90, may_die=[2], transport=transport, env={"NDIST_ENGINE": engine})
    for rank in (0, 1):
        got, took = res[rank]
        assert got == ("DistRankFailureError", [2]), (rank, res[rank])
        assert took < 1.5, (rank, res[rank])
