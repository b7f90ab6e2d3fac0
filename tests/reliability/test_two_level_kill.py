"""A rank SIGKILLed while the others are in a repeated blocking call on a two-level group
(2 simulated hosts of 2, every call in two levels: the call runs in one C call, ``ctwo.c``
behind FastLane): every survivor raises the typed error naming it, on its host and on the
other, whichever level it waits in, and none hangs."""

import pytest

from ndist.testing import run_ranks

pytest.importorskip("ndist.collectives.backends.socket.native._cnative")


def _killed_in_a_call(rank, size, victim):
    import os
    import signal
    import time

    import numpy as np

    import ndist.distributed as dist
    from ndist.runtime import resolve_group
    from ndist.runtime._world import _world
    from tests.kill_sync import all_past

    x = np.ones(1024, np.float32)
    for _ in range(3):  # the group's set-up, then its FastLane (the repeated call in C)
        dist.all_reduce(x)
    kind = type(resolve_group(None).backend_for("cpu")._native.g).__name__
    all_past(_world.job_store, rank, size, victim=victim)
    if rank == victim:
        time.sleep(0.5)  # the others are waiting on it by now
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        for _ in range(20):
            dist.all_reduce(x)
        got = None
    except dist.DistError as err:
        got = (type(err).__name__, getattr(err, "failed_ranks", None), str(err))
    took = time.monotonic() - t0
    time.sleep(1.0)  # (a survivor leaving early would be a loss too, for the others)
    return kind, got, took


@pytest.mark.timeout(120)
@pytest.mark.parametrize("victim", [3])  # (the second host's rank that is no leader: the failure
# crosses both levels on both hosts: its leader in shared memory, rank 0 over TCP, rank 1 in shared memory)
def test_a_rank_killed_in_a_two_level_call_is_named_by_every_survivor(victim):
    env = {"NDIST_ENGINE": "native", "NDIST_NATIVE_HOSTS": "2", "NDIST_NATIVE_TWO_LEVEL_MIN": "0"}
    res = run_ranks(_killed_in_a_call, 4, args=(victim,), timeout=90, may_die=[victim], env=env)
    for rank in range(4):
        if rank == victim:
            continue
        kind, got, took = res[rank]
        assert kind == "TwoLevelGroup", (rank, kind)
        assert got is not None and got[0] == "DistRankFailureError" and got[1] == [victim], (rank, got)
        assert f"rank {victim}" in got[2], (rank, got)
        assert took < 10, (rank, took)  # named at once (the group's timeout is far longer)
