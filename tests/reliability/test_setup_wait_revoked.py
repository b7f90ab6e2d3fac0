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

_TIMEOUT_S = 10.0


def _job(rank, size):
    import os
    import signal
    import time
    from datetime import timedelta

    import numpy as np

    import ndist.distributed as dist
    from ndist.collectives._staging import HostArrays, HostStagingBackend
    from ndist.runtime import get_backend_spec, register_backend
    from ndist.runtime._world import _world

    register_backend("staged-socket",
                     lambda ctx: HostStagingBackend(get_backend_spec("socket").create(ctx), HostArrays()))
    dist.init_process_group("socket", timeout=timedelta(seconds=_TIMEOUT_S))
    try:
        store = _world.job_store
        sub = dist.new_group([0, 1], backend="staged-socket")
        out = {}
        if rank == 2:
            store.wait(["revoked/waiting"])
            time.sleep(0.3)  # rank 0 is in the subgroup's set-up by now
            store.set("revoked/killed", repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == 0:  # waits for rank 1's address; rank 1 never joins
            store.set("revoked/waiting", "1")
            try:
                dist.all_reduce(np.ones(4, dtype=np.float32), group=sub)
                out["sub"] = "no error"
            except dist.DistError as err:
                out["sub"] = (type(err).__name__, getattr(err, "failed_ranks", None), err.rank, str(err))
            out["took"] = time.time() - float(store.get("revoked/killed"))
        if rank == 1:
            deadline = time.monotonic() + 30
            while 2 not in _world.lost:  # (the watch saw rank 2 go)
                assert time.monotonic() < deadline, "rank 2's loss was never told"
                time.sleep(0.01)
        dist.shrink_group()
        y = np.full(4, float(rank + 1), dtype=np.float32)
        dist.all_reduce(y)
        out.update(size=dist.get_world_size(), rank=dist.get_rank(), sum=float(y[0]))
        dist.barrier()
        return out
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_a_set_up_waiting_for_an_address_ends_when_its_group_is_revoked(transport):
    res = run_ranks(_job, 3, init=False, timeout=90, may_die=[2], transport=transport)
    assert res[2] is None
    kind, failed, named, message = res[0]["sub"]
    assert kind == "DistRankFailureError" and failed == [] and named == 2, res[0]
    assert "rank 2" in message and "shrink_group" in message, message
    assert res[0]["took"] < 3.0, res[0]  # (the group timeout is 10 s)
    for rank in (0, 1):
        r = res[rank]
        assert r["size"] == 2 and r["rank"] == rank and r["sum"] == 3.0, (rank, r)
