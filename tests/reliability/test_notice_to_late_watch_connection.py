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
from tests.reliability.shrink_scenarios import check_survivors

_TIMEOUT_S = 10.0


def _job(rank, size):
    import threading

    import ndist.distributed as dist
    from ndist.runtime import _watch
    from tests.reliability.shrink_scenarios import Api, die, wait_for

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
    api = Api("ndist")
    with api.joined(_TIMEOUT_S):
        store = api.store
        sub = dist.new_group([0, 1])
        dist.barrier()
        out = {}
        if rank == 2:
            store.wait(["late/waiting"])
            die()
        if rank == 1:  # waits for rank 0, which goes to shrink_group instead
            store.set("late/waiting", "1")
            api.timed(out, lambda: dist.all_reduce(api.ones(4), group=sub))
        if rank == 0:
            wait_for(lambda: 2 in dist.get_failed_ranks(), "rank 2's loss was never seen")  # (the member watch)
            out["told before connecting"] = not told.is_set()
        return api.finish(rank, out)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport, engine", [("tcp", "python"), ("auto", "native")])
def test_a_notice_told_before_a_watch_connection_was_made_reaches_that_peer(transport, engine):
    res = run_ranks(_job, 3, init=False, timeout=90, may_die=[2], transport=transport,
                    env={"NDIST_ENGINE": engine})
    assert res[2] is None
    assert res[0]["told before connecting"], res[0]  # the case: no connection to rank 1 at the notice
    sub = res[1]["sub"]
    assert sub["kind"] == "DistRankFailureError" and sub["rank"] == 2, res[1]
    assert "rank 0" in sub["msg"] and "shrink_group" in sub["msg"], sub["msg"]
    assert res[1]["took"] < 5.0, res[1]  # (the group timeout is 10 s)
    check_survivors(res, (0, 1), 2, 3.0)
