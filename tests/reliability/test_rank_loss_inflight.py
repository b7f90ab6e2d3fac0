"""A point-to-point operation (or an async collective) already in flight when a member
dies raises the group's ``DistRankFailureError`` too, not the backend's plain
``DistNetworkError``: ``wait`` gives the revoked group's error, with the backend's as its
cause. Found by the ``--on-failure continue`` kill trials (tools/trials/kill_trials.py, seeds
300, 316, 319): survivors in a blocking ``recv`` or waiting on ``batch_isend_irecv`` works
when the ring's member died got ``DistNetworkError`` with no ``failed_ranks``, so a program
catching ``DistRankFailureError`` to shrink did not."""

import pytest

from ndist.testing import run_ranks


def _inflight_job(rank, size, engine_kind):
    import logging
    import os
    import signal
    import time

    import numpy as np

    import ndist.distributed as dist
    from ndist.runtime._world import _world
    from tests.kill_sync import all_past

    hook_errors = []  # a Work's completion hook that raised logs "a completion hook of <Work> raised"

    class Catch(logging.Handler):
        def emit(self, record):
            if "completion hook" in record.getMessage():
                hook_errors.append(record.getMessage())

    logging.getLogger("ndist").addHandler(Catch())
    x = np.ones(64, dtype=np.float32)
    dist.all_reduce(x)  # links exist
    all_past(_world.job_store, rank, size, victim=1)
    if rank == 1:
        time.sleep(0.5)  # the others are waiting on it by now
        os.kill(os.getpid(), signal.SIGKILL)
    buf = np.zeros(64, dtype=np.float32)
    try:
        if engine_kind == "irecv":
            dist.irecv(buf, src=1).wait()
        elif engine_kind == "recv":
            dist.recv(buf, src=1)
        elif engine_kind == "batch":
            ops = [dist.P2POp(dist.irecv, buf, 1), dist.P2POp(dist.isend, x, 1)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        else:  # an async collective that rank 1 never joins
            dist.all_reduce(x, async_op=True).wait()
        got = "no error"
    except dist.DistError as err:
        got = (type(err).__name__, getattr(err, "failed_ranks", None), type(err.__cause__).__name__)
    time.sleep(1.0)  # (a survivor leaving early would be a loss too, for the other)
    return got, hook_errors


@pytest.mark.timeout(120)
@pytest.mark.parametrize("engine", ["native", "python"])
@pytest.mark.parametrize("kind", ["irecv", "recv", "batch", "async all_reduce"])
def test_an_op_in_flight_when_a_member_dies_raises_the_rank_failure(engine, kind):
    res = run_ranks(_inflight_job, 3, args=(kind,), timeout=90, may_die=[1], env={"NDIST_ENGINE": engine})
    for rank in (0, 2):
        (kind_, failed, _cause), hook_errors = res[rank]
        assert kind_ == "DistRankFailureError" and failed == [1], (rank, res[rank])
        assert hook_errors == [], (rank, hook_errors)  # the failure is the waiter's, not a logged traceback
