"""A member that dies while the survivors build a group's links (their first collective
waits in the store for the addresses it never publishes) fails them at once, naming it,
not at the group timeout. Found by examples/elastic_training.py with ``--kill-rank 0
--kill-step 0``: the survivors' first all_reduce waited in ``Mesh.wait_published``, which
looked only at members known dead by pid or by another group's record, not at the loss the
member watch had just told the group (``Mesh.abandon``)."""

import time
from datetime import timedelta

import numpy as np
import pytest

import ndist.distributed as dist
from ndist.testing import run_ranks
from tests.kill_sync import kill_self, killed_at


def _job(rank, size, out):
    dist.init_process_group("socket", timeout=timedelta(seconds=20))
    if rank == 0:
        time.sleep(1.0)  # the others are waiting for its address by now
        kill_self(out)
    try:
        dist.all_reduce(np.ones(4, dtype=np.float32))  # its first collective: the links are built now
        rec = None
    except dist.DistError as err:
        rec = (time.time(), type(err).__name__, getattr(err, "failed_ranks", None), str(err))
    time.sleep(2.0)  # (a survivor leaving early would be a loss too, for a slower one)
    return rec


@pytest.mark.timeout(90)
@pytest.mark.parametrize("engine", ["native", "python"])
@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_member_that_dies_while_the_links_are_built_is_named_at_once(tmp_path, engine, transport):
    t0 = time.monotonic()
    out = run_ranks(_job, 3, args=(str(tmp_path),), init=False, may_die=[0], timeout=60,
                    env={"NDIST_ENGINE": engine, "NDIST_TRANSPORT": transport})
    assert time.monotonic() - t0 < 15, "the survivors waited for the group timeout"
    killed = killed_at(tmp_path)
    for rec in out[1:]:
        assert rec is not None, out  # (None: no error)
        at, kind, failed, _ = rec
        assert kind == "DistRankFailureError" and failed == [0], rec
        assert at - killed < 1.0, rec
