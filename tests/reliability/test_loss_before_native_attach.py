"""A loss the socket backend records while its first collective is attaching the native
engine (before the engine's loss hook is in place) still ends that collective's set-up
barrier at once, naming the lost process (issue 29; continue kill trial seed 60135: n=4,
shm, native engine, rank 3 killed by the timer; recovery 2.06-2.30 s in 4 of 6 reruns).

In the trial, rank 0's first collective on subgroup [0, 2] was in the native set-up when
rank 0 began ``shrink_group`` on the world, which revoked [0, 2]
(``ProcessGroup.revoke_for`` -> the backend's ``group_revoked``): the loss was recorded
(``GroupFailure.record``) just before the set-up registered its hook, so nothing woke the
set-up barrier, which waited for rank 2 (gone to the shrink) until the shrink closed the
group, after the close's 2 s wait for the executor thread.

Here the order is made certain: on 2 ranks, rank 0's first collective (which rank 1 never
joins) is told that the group is aborted (the backend's ``group_revoked`` hook, as
``revoke_for`` calls it) from inside that window: the test wraps the native module's
``attach`` (the real one runs right after) to call the hook first. Before the fix the
set-up barrier waited for rank 1 until the group timeout (``DistTimeoutError``); now it
raises at once, naming the lost process."""

import pytest

from ndist.testing import run_ranks

_TIMEOUT_S = 8.0


def _job(rank, size):
    import time
    from datetime import timedelta

    import numpy as np

    import ndist.distributed as dist
    from ndist.runtime._world import _world

    dist.init_process_group("socket", timeout=timedelta(seconds=_TIMEOUT_S))
    try:
        store = _world.job_store
        out = {}
        if rank == 0:
            from ndist.collectives.backends.socket import _backend as socket_backend

            backend = _world.default.backend_for("cpu")
            out["engine"] = backend.engine
            real_attach = socket_backend._native.attach

            def attach(*args, **kwargs):  # the window: the group's loss hook is not in place yet
                # the world is aborted for process 7 (not a member: a loss another group learnt)
                backend.group_revoked(7, "elsewhere", "the group is aborted by this test")
                return real_attach(*args, **kwargs)

            socket_backend._native.attach = attach
            store.wait(["attach/published"], timedelta(seconds=60))
            t0 = time.monotonic()
            try:
                dist.all_reduce(np.ones(4, dtype=np.float32))
                out["op"] = "no error"
            except dist.DistError as err:
                out["op"] = (type(err).__name__, getattr(err, "rank", None), str(err))
            out["took"] = time.monotonic() - t0
            store.set("attach/done", "1")
        else:  # its backend publishes its address and native file; it never joins the collective
            _world.default.backend_for("cpu")
            store.set("attach/published", "1")
            store.wait(["attach/done"], timedelta(seconds=60))
        return out
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(90)
def test_a_loss_recorded_before_the_native_set_up_ends_its_barrier():
    res = run_ranks(_job, 2, init=False, timeout=60, transport="auto", env={"NDIST_ENGINE": "native"})
    r = res[0]
    if r["engine"] != "native":
        pytest.skip(f"the native engine is not built here (engine {r['engine']!r})")
    kind, named, message = r["op"]
    assert kind in ("DistNetworkError", "DistRankFailureError") and named == 7, r
    assert "rank 7 (elsewhere)" in message, message
    assert r["took"] < _TIMEOUT_S / 4, r  # at once, not at the group timeout
