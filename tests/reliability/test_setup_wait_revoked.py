"""A group's link set-up that waits for a peer's address ends when the group is revoked,
also when its socket backend sits behind ndist's host-staging wrapper (the CUDA path:
``_staging.HostStagingBackend``, here with NumPy arrays in the device role), which must pass
the group's loss hooks on (issue 29; continue kill trial seed 40000): rank 0 gets the group's
``DistRankFailureError`` naming the lost process, not ``DistTimeoutError`` after the group
timeout.

3 ranks, subgroup [0, 1] on the staged socket backend. Rank 0 waits in the subgroup's first
op for rank 1's address; rank 2 is SIGKILLed; rank 1 sees it (member watch) and calls
``shrink_group()`` on the default group, which revokes [0, 1] on rank 0
(``_World.peer_notice`` -> ``ProcessGroup.revoke_for`` -> the backend's ``group_revoked``).
Before the wrapper passed the hooks on, rank 0 waited the whole group timeout, and ranks 1
and 2's shrink timed out waiting for it."""

import pytest

from ndist.testing import run_ranks
from tests.reliability.shrink_scenarios import check_survivors

_TIMEOUT_S = 10.0


def _job(rank, size):
    import time

    import ndist.distributed as dist
    from ndist.collectives._staging import HostArrays, HostStagingBackend
    from ndist.runtime import get_backend_spec, register_backend
    from tests.reliability.shrink_scenarios import Api, die, wait_for

    register_backend("staged-socket",
                     lambda ctx: HostStagingBackend(get_backend_spec("socket").create(ctx), HostArrays()))
    api = Api("ndist")
    with api.joined(_TIMEOUT_S):
        store = api.store
        sub = dist.new_group([0, 1], backend="staged-socket")
        out = {}
        if rank == 2:
            store.wait(["revoked/waiting"])
            time.sleep(0.3)  # rank 0 is in the subgroup's set-up by now
            store.set("revoked/killed", repr(time.time()))
            die()
        if rank == 0:  # waits for rank 1's address; rank 1 never joins
            store.set("revoked/waiting", "1")
            out["sub"] = api.attempt(lambda: dist.all_reduce(api.ones(4), group=sub))
            out["took"] = time.time() - float(store.get("revoked/killed"))
        if rank == 1:
            wait_for(lambda: 2 in api.watch_lost(), "rank 2's loss was never told")
        return api.finish(rank, out)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_a_set_up_waiting_for_an_address_ends_when_its_group_is_revoked(transport):
    res = run_ranks(_job, 3, init=False, timeout=90, may_die=[2], transport=transport)
    assert res[2] is None
    sub = res[0]["sub"]
    assert (sub["kind"], sub["failed"], sub["rank"]) == ("DistRankFailureError", [], 2), res[0]
    assert "rank 2" in sub["msg"] and "shrink_group" in sub["msg"], sub["msg"]
    assert res[0]["took"] < 3.0, res[0]  # (the group timeout is 10 s)
    check_survivors(res, (0, 1), 2, 3.0)
