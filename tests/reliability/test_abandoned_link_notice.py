"""A member lost while a peer's collective link waits in this rank's mesh (accepted, not
yet taken by its engine) gets the lost notice on that link: the peer's op fails naming the
dead member, not this live rank, and both survivors shrink into one group. Found by the
``--on-failure continue`` kill trials (tools/trials/kill_trials.py, seed 20029: the notice's
method was gone, the loss never reached the collective engine and a survivor's first
collective on the shrunk group hung until the others timed out; seed 20076: the dropped link
looked to the peer like this rank's loss, and the survivors excluded it).

Rank 0 makes its backend, runs no collective and waits in a receive from rank 1, which sends
nothing (the loss must fail it at once: the point-to-point side is told after the mesh);
ranks 1 and 2 start an all_to_all, which dials every peer at once; once rank 1's link waits
in rank 0's mesh, rank 2 dies."""

import pytest

from ndist.testing import run_ranks
from tests.reliability.shrink_scenarios import check_survivors


def _job(rank, size):
    import time
    from datetime import timedelta

    import numpy as np

    import ndist.distributed as dist
    from tests.reliability.shrink_scenarios import Api, die, wait_for

    api = Api("ndist")
    store = api.store
    inp = np.arange(3, dtype=np.float64)
    out = np.empty(3, dtype=np.float64)
    got = None
    if rank == 0:
        mesh = api.ndist_group().backend_for("cpu")._mesh
        # rank 1's link, accepted and waiting for this rank's engine
        wait_for(lambda: 1 in mesh._coll, "rank 1's collective link never came")
        w = dist.irecv(np.empty(3, dtype=np.float64), src=1)  # rank 1 sends nothing: the loss must fail it
        store.set("ctfix/die", "1")
        got = api.attempt(lambda: w.wait(timedelta(seconds=5)))
    elif rank == 2:
        dist.all_to_all_single(out, inp, async_op=True)
        store.wait(["ctfix/die"])
        time.sleep(0.2)  # (rank 1's dial of rank 2 done too)
        die()
    else:
        got = api.attempt(lambda: dist.all_to_all_single(out, inp))
    time.sleep(0.5)  # (a link dropped unannounced would be recorded as a loss by now)
    rec = {"got": got, "failed": dist.get_failed_ranks()}
    try:
        return api.shrink_and_sum(rank, None, rec)
    except ValueError as err:
        rec["refused"] = str(err)
        return rec


@pytest.mark.timeout(120)
@pytest.mark.parametrize("engine", ["native", "python"])
def test_a_link_waiting_in_the_mesh_gets_the_lost_notice(engine):
    # (tcp: a same-host group runs on the native engine otherwise, which opens no links)
    res = run_ranks(_job, 3, timeout=90, may_die=[2], transport="tcp", env={"NDIST_ENGINE": engine})
    for rank in (0, 1):
        got = res[rank]["got"]
        assert (got["kind"], got["failed"]) == ("DistRankFailureError", [2]), res
        assert res[rank]["failed"] == [2] and "refused" not in res[rank], res
    check_survivors(res, (0, 1), 2, 3.0)
