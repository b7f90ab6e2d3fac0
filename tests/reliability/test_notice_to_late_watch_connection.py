"""A shrink notice told while the member watch's mesh was still being made reaches the
peer whose watch connection came later (issue 29; continue kill trials seed 100033 and
100183: n=8, a rank killed at the start).

``MemberWatch.tell`` sent a notice only on the connections that existed; a peer connected
after it never got it. There, a survivor waiting in a group on a member that had gone into
``shrink_group`` was not released: it waited the whole group timeout, while that member's
agreement waited for it. The watch now keeps the notices it told and sends them on each
connection as it is made.

3 ranks, group timeout 10 s. Rank 0's watch takes its connection to rank 1 only after it
told its shrink notice (as a slow mesh would); rank 2 is SIGKILLed; rank 1 waits in the
first op of subgroup [0, 1], which rank 0 never joins. Rank 1's op must raise the
``DistRankFailureError`` naming rank 2 at once, not ``DistTimeoutError`` after 10 s."""

import pytest

from ndist.testing import run_ranks

_TIMEOUT_S = 10.0


def _job(rank, size):
    import os
    import signal
    import threading
    import time
    from datetime import timedelta

    import numpy as np

    import ndist.distributed as dist
    from ndist.runtime import _watch
    from ndist.runtime._world import _world

    if rank == 0:  # the watch connection to rank 1 is taken only once a notice was told
        told = threading.Event()
        adopt, tell = _watch.MemberWatch._adopt, _watch.MemberWatch.tell

        def late_adopt(self, peer, sock):
            if peer != 1 or told.is_set():
                return adopt(self, peer, sock)
            threading.Thread(target=lambda: (told.wait(60), adopt(self, peer, sock)), daemon=True).start()

        def tell_then_connect(self, notice):
            sent = tell(self, notice)
            told.set()
            return sent

        _watch.MemberWatch._adopt = late_adopt
        _watch.MemberWatch.tell = tell_then_connect
    dist.init_process_group("socket", timeout=timedelta(seconds=_TIMEOUT_S))
    try:
        store = _world.job_store
        sub = dist.new_group([0, 1])
        dist.barrier()
        out = {}
        if rank == 2:
            store.wait(["late/waiting"])
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == 1:  # waits for rank 0, which goes to shrink_group instead
            store.set("late/waiting", "1")
            t0 = time.monotonic()
            try:
                dist.all_reduce(np.ones(4, dtype=np.float32), group=sub)
                out["sub"] = "no error"
            except dist.DistError as err:
                out["sub"] = (type(err).__name__, err.rank, str(err))
            out["took"] = time.monotonic() - t0
        if rank == 0:
            deadline = time.monotonic() + 30
            while 2 not in dist.get_failed_ranks():  # the member watch saw it go
                assert time.monotonic() < deadline, "rank 2's loss was never seen"
                time.sleep(0.01)
            out["told before connecting"] = not told.is_set()
        dist.shrink_group()
        y = np.full(4, float(rank + 1), dtype=np.float32)
        dist.all_reduce(y)
        out.update(size=dist.get_world_size(), sum=float(y[0]))
        dist.barrier()
        return out
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport, engine", [("tcp", "python"), ("auto", "native")])
def test_a_notice_told_before_a_watch_connection_was_made_reaches_that_peer(transport, engine):
    res = run_ranks(_job, 3, init=False, timeout=90, may_die=[2], transport=transport,
                    env={"NDIST_ENGINE": engine})
    assert res[2] is None
    assert res[0]["told before connecting"], res[0]  # the case: no connection to rank 1 at the notice
    kind, named, message = res[1]["sub"]
    assert kind == "DistRankFailureError" and named == 2, res[1]
    assert "rank 0" in message and "shrink_group" in message, message
    assert res[1]["took"] < 5.0, res[1]  # (the group timeout is 10 s)
    for rank in (0, 1):
        assert res[rank]["size"] == 2 and res[rank]["sum"] == 3.0, (rank, res[rank])
