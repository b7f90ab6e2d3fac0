"""A rank SIGKILLed while the others are in a repeated blocking call on a two-level group
(2 simulated hosts of 2, every call in two levels: the call runs in one C call, ``ctwo.c``
behind FastLane): every survivor raises the typed error naming it, on its host and on the
other, whichever level it waits in, and none hangs. Also in the middle of large direct
reduce_scatters, whose parts the ranks (one machine here) read from each other's memory
(ctcp.c's single copy): a reader whose peer dies under it names that peer too."""

import pytest

from ndist.testing import run_ranks

pytest.importorskip("ndist.collectives.backends.socket.native._cnative")


def _killed_in_a_call(rank, size, victim, op):
    import os
    import signal
    import threading
    import time

    import numpy as np

    import ndist.distributed as dist
    from ndist.runtime import resolve_group
    from ndist.runtime._world import _world
    from tests.kill_sync import all_past

    if op == "all_reduce":
        x = np.ones(1024, np.float32)
        call, calls = (lambda: dist.all_reduce(x)), 20
    else:  # 16 MiB in, a 4 MiB part to every peer: by address
        inp, out = np.ones(4 << 20, np.float32), np.empty(1 << 20, np.float32)
        call, calls = (lambda: dist.reduce_scatter_tensor(out, inp)), 100_000
    for _ in range(3):  # the group's set-up, then its FastLane (the repeated call in C)
        call()
    g = resolve_group(None).backend_for("cpu")._native.g
    kind = type(g).__name__
    all_past(_world.job_store, rank, size, victim=victim)
    if rank == victim:
        if op == "all_reduce":
            time.sleep(0.5)  # the others are waiting on it by now
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()  # in a call, mid-loop
    t0 = time.monotonic()
    try:
        for _ in range(calls):
            call()
        got = None
    except dist.DistError as err:
        got = (type(err).__name__, getattr(err, "failed_ranks", None), str(err), getattr(err, "rank", None))
    took = time.monotonic() - t0
    time.sleep(1.0)  # (a survivor leaving early would be a loss too, for the others)
    return kind, got, took, g.tcp.cma_blocks


@pytest.mark.timeout(120)
@pytest.mark.parametrize("victim", [3])  # (the second host's rank that is no leader: the failure
# crosses both levels on both hosts: its leader in shared memory, rank 0 over TCP, rank 1 in shared memory)
@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter"])
def test_a_rank_killed_in_a_two_level_call_is_named_by_every_survivor(victim, op):
    env = {"NDIST_ENGINE": "native", "NDIST_NATIVE_HOSTS": "2", "NDIST_NATIVE_TWO_LEVEL_MIN": "0"}
    res = run_ranks(_killed_in_a_call, 4, args=(victim, op), timeout=90, may_die=[victim], env=env)
    for rank in range(4):
        if rank == victim:
            continue
        kind, got, took, cma = res[rank]
        assert kind == "TwoLevelGroup", (rank, kind)
        if op == "all_reduce":
            assert got is not None and got[0] == "DistRankFailureError" and got[1] == [victim], (rank, got)
        else:  # (a lost link, or the member watch's loss: whichever came first)
            assert got is not None and got[0] in ("DistNetworkError", "DistRankFailureError"), (rank, got)
            assert got[3] == victim or got[1] == [victim], (rank, got)
            assert cma >= 3 * 3, (rank, cma)  # (the set-up calls' parts came by address)
        assert f"rank {victim}" in got[2], (rank, got)
        assert took < 10, (rank, took)  # named at once (the group's timeout is far longer)
