"""A survivor that begins ``shrink_group`` on the default group tells every other process,
and revokes its other groups, when any of its groups knows a loss, not only when the
default group's own record holds it (issue 29; continue kill trial seed 40000, trial 0).

4 ranks, subgroups [0, 1] and [1, 2, 3], no collective on the world before the loss.
Rank 0 waits in the first op of [0, 1] (its set-up waits for rank 1's address); rank 2
is SIGKILLed; ranks 1 and 3 learn of it in [1, 2, 3] and call ``shrink_group()``. On
rank 1 the member watch has not told the loss yet (its thread is held back, as it was
under load in the trial: this test holds ``_World.numbering_lock``, which the watch's
thread takes to record a loss, for 3 s after rank 1 learnt of the loss), so only the
subgroup knows it. Before the fix rank 1's ``begin_default_shrink`` found the default
group's record empty and told nobody: rank 0 was never released (rank 3's notice does
not concern [0, 1]) and raised ``DistTimeoutError`` after the group timeout, by when
ranks 1 and 3 had timed out their agreement waiting for it. Now rank 1 tells at once:
rank 0's op raises ``DistRankFailureError`` naming rank 2, and the three finish."""

import pytest

from ndist.testing import run_ranks

_TIMEOUT_S = 10.0  # the group timeout: a survivor not released waits this long
_HOLD_S = 3.0  # rank 1's watch is held back this long after rank 1 learnt of the loss


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
        sub01 = dist.new_group([0, 1])
        sub123 = dist.new_group([1, 2, 3])
        x = np.ones(4, dtype=np.float32)
        out = {}
        if rank in (1, 2, 3):
            dist.all_reduce(x, group=sub123)  # the subgroup's links exist
        if rank == 1:  # the watch's thread is held back from telling the loss
            held, learnt = threading.Event(), threading.Event()

            def hold():
                with _world.numbering_lock:
                    held.set()
                    learnt.wait(60)
                    time.sleep(_HOLD_S)

            threading.Thread(target=hold, daemon=True).start()
            held.wait(60)
            store.set("anyloss/held", "1")
        if rank == 2:
            store.wait(["anyloss/held", "anyloss/waiting"])
            time.sleep(0.3)  # rank 0 is in the subgroup's set-up by now
            store.set("anyloss/killed", repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == 0:  # waits in [0, 1] for rank 1's address; rank 1 never joins
            store.set("anyloss/waiting", "1")
            try:
                dist.all_reduce(np.ones(4, dtype=np.float32), group=sub01)
                out["sub"] = "no error"
            except dist.DistError as err:
                out["sub"] = (type(err).__name__, getattr(err, "failed_ranks", None), err.rank, str(err))
            out["took"] = time.time() - float(store.get("anyloss/killed"))
        else:
            try:
                while True:
                    dist.all_reduce(x, group=sub123)
            except dist.DistError as err:
                out["sub"] = (type(err).__name__, getattr(err, "failed_ranks", None))
            if rank == 1:
                # only the subgroup knows the loss here: the default group's record does not
                out["world_knew"] = dist.get_failed_ranks()
                learnt.set()
        t1 = time.monotonic()
        dist.shrink_group()
        y = np.full(4, float(rank + 1), dtype=np.float32)
        dist.all_reduce(y)
        out.update(shrink=time.monotonic() - t1, size=dist.get_world_size(), rank=dist.get_rank(), sum=float(y[0]))
        dist.barrier()
        return out
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport,engine", [("tcp", "python"), ("auto", "native")])
def test_a_shrink_begun_on_a_loss_only_a_subgroup_knows_tells_the_others(transport, engine):
    res = run_ranks(_job, 4, init=False, timeout=90, may_die=[2], transport=transport,
                    env={"NDIST_ENGINE": engine})
    assert res[2] is None
    assert res[1]["sub"] == ("DistRankFailureError", [1]), res[1]  # rank 2 is group rank 1 of [1, 2, 3]
    assert res[1]["world_knew"] == [], res[1]  # the case: the default group did not know yet
    kind, failed, named, message = res[0]["sub"]
    assert kind == "DistRankFailureError" and failed == [] and named == 2, res[0]
    assert "shrink_group" in message, message
    assert res[0]["took"] < _HOLD_S, res[0]  # released by rank 1's shrink, not by any timeout
    for rank, new_rank in ((0, 0), (1, 1), (3, 2)):
        r = res[rank]
        assert r["size"] == 3 and r["rank"] == new_rank and r["sum"] == 1.0 + 2.0 + 4.0, (rank, r)
