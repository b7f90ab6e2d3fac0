"""A survivor whose group does not know yet that a member is lost, with point-to-point
operations of that group still pending on it, finishes ``shrink_group`` excluding it without
waiting for them (issue 29; continue kill trial seed 60174: n=4, shm, Python engine, rank 3
killed right after ``init_process_group``, rank 2 released from a subgroup by another
survivor's shrink notice before its own member watch told it).

4 ranks. Rank 2's member watch is held back (this test holds ``_World.numbering_lock``,
which the watch takes to record a loss, as a watch late under load is). Rank 2 posts an
``isend`` and an ``irecv`` with rank 3 on the world, which has no link to rank 3 (rank 3
never publishes its address there). Rank 3 is SIGKILLed; rank 2 calls
``shrink_group([3])``, ranks 0 and 1 ``shrink_group()`` once their watches saw it go; they
agree to exclude rank 3. Before the fix, rank 2's shrink closed the world gracefully with
both operations pending: the close waited for the queued send to rank 3 for the whole group
timeout (and the loss the watch told once released no longer reached a group being closed),
so ranks 0 and 1 timed out in the shrunk group's set-up waiting for rank 2. Now a shrink
first records the members it excludes as lost in the group it shrinks: what is pending on
them fails at once, naming them."""

import pytest

from ndist.testing import run_ranks

_TIMEOUT_S = 10.0  # the group timeout: a close that waits on the pending send waits this long
_HOLD_S = 3.0  # rank 2's watch is held back this long after rank 2 learnt of the loss


def _job(rank, size):
    import os
    import signal
    import threading
    import time
    from datetime import timedelta

    import numpy as np

    import ndist.distributed as dist
    from ndist.runtime._world import _world

    dist.init_process_group("socket", timeout=timedelta(seconds=_TIMEOUT_S))
    try:
        store = _world.job_store
        out = {}
        pending = []
        if rank == 2:
            held, asked = threading.Event(), threading.Event()

            def hold():  # the watch cannot record rank 3's loss until released
                with _world.numbering_lock:
                    held.set()
                    asked.wait(60)
                    time.sleep(_HOLD_S)

            threading.Thread(target=hold, daemon=True).start()
            held.wait(60)
            pending = [dist.isend(np.arange(4, dtype=np.float32), dst=3),
                       dist.irecv(np.empty(4, dtype=np.float32), src=3)]
            store.set("pending/posted", "1")
        if rank == 3:
            store.wait(["pending/posted"])
            store.set("pending/killed", "1")
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == 2:
            store.wait(["pending/killed"])
            deadline = time.monotonic() + 30
            while not all(store.check([f"pending/saw/{r}"]) for r in (0, 1)):
                assert time.monotonic() < deadline, "ranks 0 and 1 never saw rank 3 go"
                time.sleep(0.01)
            out["watch_knew"] = 3 in _world.lost or dist.get_failed_ranks() != []  # the case: not yet
            asked.set()
        else:
            deadline = time.monotonic() + 30
            while 3 not in _world.lost:
                assert time.monotonic() < deadline, "rank 3's loss was never told"
                time.sleep(0.01)
            store.set(f"pending/saw/{rank}", "1")
        t1 = time.monotonic()
        dist.shrink_group([3] if rank == 2 else None)
        out["shrink"] = time.monotonic() - t1
        y = np.full(4, float(rank + 1), dtype=np.float32)
        dist.all_reduce(y)
        out.update(size=dist.get_world_size(), rank=dist.get_rank(), sum=float(y[0]))
        for w in pending:  # failed at the shrink, naming rank 3
            try:
                w.wait()
                out.setdefault("pending", []).append("completed")
            except dist.DistError as err:
                out.setdefault("pending", []).append((type(err).__name__, err.rank))
        dist.barrier()
        return out
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport,engine", [("tcp", "python"), ("auto", "native")])
def test_a_shrink_does_not_wait_for_operations_pending_on_an_excluded_rank(transport, engine):
    res = run_ranks(_job, 4, init=False, timeout=90, may_die=[3], transport=transport,
                    env={"NDIST_ENGINE": engine})
    assert res[3] is None
    assert res[2]["watch_knew"] is False, res[2]
    assert res[2]["shrink"] < _TIMEOUT_S / 2, res[2]  # the hold, not the group timeout
    assert [p[0] for p in res[2]["pending"]] == ["DistRankFailureError"] * 2, res[2]
    for rank in (0, 1, 2):
        r = res[rank]
        assert r["size"] == 3 and r["rank"] == rank and r["sum"] == 6.0, (rank, r)
