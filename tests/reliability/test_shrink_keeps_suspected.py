"""``shrink_group()`` keeps a member that a connection failure made other survivors record
as lost, when it is alive and calls ``shrink_group`` too: the agreement counts as lost only
what the member watch saw go (the process ended), never a member a backend merely lost a
connection to; and the survivors that recorded it lost connect to it again in the shrunk
group. Found by the ``--on-failure continue`` kill trials (tools/trials/kill_trials.py, seed
20076: a survivor's link to an alive rank closed without a notice, it recorded that rank
lost, and the agreement excluded it although it called shrink_group: it raised ValueError,
the others went on without it).

Four ranks over TCP: rank 0 resets its collective link to rank 1 (a connection failing by
itself, as a middlebox's reset would), rank 1's next collective finds it closed and records
rank 0 lost (and tells ranks 0 and 2), then rank 3 dies. Every survivor must end in one
group of three."""

import pytest

from ndist.testing import run_ranks


def _job(rank, size):
    import os
    import signal
    import socket
    import time

    import numpy as np

    import ndist.distributed as dist
    from ndist.runtime._world import _world

    store = _world.job_store
    pg = _world.default
    inp = np.arange(4, dtype=np.float64)
    out = np.empty(4, dtype=np.float64)
    dist.all_to_all_single(out, inp)  # every pair linked
    if rank == 0:
        pg.backend_for("cpu")._eng.conns[1].sock.shutdown(socket.SHUT_RDWR)
        store.set("ctfix/reset", "1")
    if rank == 1:
        store.wait(["ctfix/reset"])
    if rank == 3:
        store.wait(["ctfix/suspected"])
        os.kill(os.getpid(), signal.SIGKILL)
    x = np.ones(4)
    try:
        dist.all_reduce(x)
        got = "no error"
    except dist.DistError as err:
        got = (type(err).__name__, getattr(err, "failed_ranks", None))
    if rank == 1:
        store.set("ctfix/suspected", "1")
    deadline = time.monotonic() + 30
    while 3 not in _world.lost:  # (the watch saw rank 3 go)
        assert time.monotonic() < deadline, "rank 3's loss was never told"
        time.sleep(0.01)
    suspected = dist.get_failed_ranks()
    try:
        dist.shrink_group()
    except ValueError as err:
        return got, suspected, f"refused: {err}"
    y = np.full(4, float(rank + 1))
    dist.all_reduce(y)
    return got, suspected, (dist.get_world_size(), float(y[0]))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("engine", ["native", "python"])
def test_a_member_suspected_lost_that_calls_shrink_group_is_kept(engine):
    # (tcp: a same-host group runs on the native engine otherwise, which has no links to reset)
    res = run_ranks(_job, 4, timeout=90, may_die=[3], transport="tcp", env={"NDIST_ENGINE": engine})
    assert res[1][0] == ("DistRankFailureError", [0]), res  # rank 1 did take rank 0 for lost
    for rank in (0, 1, 2):
        assert res[rank][2] == (3, 6.0), (rank, res)
