"""A rank that dies during point-to-point traffic fails every survivor at once,
naming it, including survivors that only wait on live ranks: the rank that
sees the death tells its peers (as collectives do), and they tell theirs."""

import time

import pytest

from tests.kill_sync import killed_at, run_with_victim, step_until_a_peer_dies

def _ring_job(rank, size, out):
    import signal
    from datetime import timedelta

    import numpy as np

    import ndist.distributed as dist

    signal.signal(signal.SIGTERM, lambda *a: None)  # stay alive to report; the launcher SIGKILLs after the grace
    dist.init_process_group("socket", timeout=timedelta(seconds=30))
    x = np.full(256, float(rank))
    y = np.empty_like(x)

    def step():
        dist.send(x, dst=(rank + 1) % size)
        dist.recv(y, src=(rank - 1) % size)
    return step_until_a_peer_dies(step, rank, size, 0, 20, out, errors=dist.DistError)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_a_ring_of_send_recv_fails_every_survivor_at_once_naming_the_dead_rank(tmp_path, transport):
    t0 = time.monotonic()
    out = run_with_victim(_ring_job, 4, 0, tmp_path, term_timeout=45, timeout=130, NDIST_TRANSPORT=transport)
    assert out.launcher_exitcode != 0, out
    killed = killed_at(tmp_path)
    for rank in (1, 2, 3):
        rec = out[rank]
        # rank 1 receives from the dead rank; rank 2 only from rank 1 and rank 3 only
        # from rank 2, both alive: they hear of it from their peers, not at the 30 s timeout
        assert rec["type"] in ("DistRankFailureError", "DistNetworkError"), (rank, rec)
        assert rec["peer"] == 0 and rec["host"], (rank, rec)
        assert "rank 0" in rec["msg"], (rank, rec)
        assert rec["t"] - killed < 3, (rank, rec)  # 1 s when the machine is quiet
    assert time.monotonic() - t0 < 120
