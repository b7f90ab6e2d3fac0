"""A rank that returns from a barrier and dies at once can fail the barrier of a rank still
in it: the member watch revokes the group, and revocation fails every pending operation.
The kill tests therefore let the victim die only once every rank is past
(``tests/kill_sync.py``); CI lost ``test_a_loss_found_in_one_group_reaches_the_processs_other_groups``
to this race once.

Made certain here: on the Python engine over TCP, rank 1 writes its barrier frame to rank 3
half a second late, so rank 0 (which has heard from everyone) returns and dies while rank 3
still waits for rank 1. Without the sync rank 3's barrier raises a ``DistError`` naming
rank 0; with it rank 3 is past the barrier before rank 0 dies."""

import time
from datetime import timedelta

import numpy as np
import pytest

import ndist.distributed as dist
from tests.kill_sync import all_past, kill_self, run_with_victim


def _job(rank, size, out, sync):
    import signal

    import ndist.collectives.backends.socket.engine._engine as engine

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stay to report; the launcher SIGKILLs after its grace
    dist.init_process_group("socket", timeout=timedelta(seconds=20))
    dist.all_reduce(np.ones(4))  # every link is up
    if rank == 1:
        write = engine.CollectiveStreams._write

        def late_to_3(self, conn):
            if conn.peer == 3 and conn.out:
                time.sleep(0.5)
            return write(self, conn)

        engine.CollectiveStreams._write = late_to_3
    try:
        dist.barrier()
        rec = {"barrier": None}
    except dist.DistError as err:
        rec = {"barrier": [type(err).__name__, err.rank]}
    if sync == "sync":
        all_past(out, rank, 4, victim=0)
    if rank == 0:
        kill_self(out)
    return rec


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sync", ["none", "sync"])
def test_a_victim_that_waits_for_every_rank_to_be_past_fails_no_barrier(tmp_path, sync):
    out = run_with_victim(_job, 4, 0, tmp_path, sync, NDIST_TRANSPORT="tcp", NDIST_ENGINE="python")
    assert out.launcher_exitcode != 0, out  # rank 0 was killed
    recs = {}
    for rank in (1, 2, 3):
        assert out[rank] is not None, (rank, out)
        recs[rank] = out[rank]["barrier"]
    if sync == "sync":
        assert recs == {1: None, 2: None, 3: None}, recs
    else:  # rank 3 still waited for rank 1's late frame when rank 0 died
        assert recs[3] is not None and recs[3][1] == 0, recs
