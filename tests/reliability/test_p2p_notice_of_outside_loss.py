"""A point-to-point peer's notice that a group was aborted for a process outside it (a
survivor began ``shrink_group`` on the default group, ``ProcessGroup.revoke_for``) fails a
receive waiting on that peer with the group's ``DistRankFailureError`` naming that process,
not a plain ``DistNetworkError`` naming "rank None" (issue 29; continue kill trials of seed
70000: 105, n=4, and 18 and 149, n=8, where the notice reached the point-to-point side
before the member watch's notice revoked the group).

4 ranks, subgroup [0, 1] with point-to-point streams both ways. Rank 3 is SIGKILLed; rank 0
learns of it on the world and calls ``shrink_group()``, which aborts [0, 1] and tells rank 1
on the subgroup's stream; rank 1 waits in a ``recv`` from rank 0 on [0, 1]. Rank 1's member
watch delivers the shrink notice 3 s late (this test wraps its ``on_notice``), so only the
subgroup's own notice can end the receive. Before the fix its point-to-point side dropped a
lost rank that is not a member of the group: the receive failed with ``DistNetworkError:
group '1': rank None (vm) is lost; rank 0 (vm) reported: rank 3 (vm) is lost; ...``, and
the group was not revoked."""

import pytest

from ndist.testing import run_ranks
from tests.reliability.shrink_scenarios import check_survivors

_DELAY_S = 3.0


def _job(rank, size, folder):
    import threading

    import ndist.distributed as dist
    from tests.kill_sync import all_past
    from tests.reliability.shrink_scenarios import Api, die

    api = Api("ndist")
    with api.joined(15.0):
        x = api.ones(4)
        dist.all_reduce(x)
        sub = dist.new_group([0, 1])
        if rank == 0:  # point-to-point streams both ways on [0, 1]
            dist.send(x, dst=1, group=sub)
            dist.recv(x, src=1, group=sub)
        elif rank == 1:
            dist.recv(x, src=0, group=sub)
            dist.send(x, dst=0, group=sub)
            watch = api.watch()
            told = watch.on_notice

            def late(sender, notice):  # the member watch's notice comes late
                threading.Timer(_DELAY_S, told, (sender, notice)).start()

            watch.on_notice = late
        dist.barrier()
        all_past(folder, rank, 4, victim=3)
        if rank == 3:
            die()
        out = {}
        if rank == 1:  # waits on rank 0, which goes to the shrink
            api.timed(out, lambda: dist.recv(api.lib.zeros(4, dtype=api.lib.float32), src=0, group=sub))
        else:
            out["world"] = api.until_loss(x)["failed"]
        return api.finish(rank, out)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("engine", ["native", "python"])
def test_a_receive_ended_by_a_peers_notice_of_an_outside_loss_names_it(tmp_path, engine):
    res = run_ranks(_job, 4, args=(str(tmp_path),), init=False, timeout=90, may_die=[3], env={"NDIST_ENGINE": engine})
    assert res[3] is None
    sub = res[1]["sub"]
    assert (sub["kind"], sub["failed"], sub["rank"]) == ("DistRankFailureError", [], 3), res[1]
    assert "rank 3" in sub["msg"] and "rank None" not in sub["msg"], sub["msg"]
    assert res[1]["took"] < _DELAY_S, res[1]  # the subgroup's notice, not the watch's late one
    check_survivors(res, (0, 1, 2), 3, 6.0)
