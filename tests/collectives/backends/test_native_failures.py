"""The native engine's failure paths that the shared suites do not reach: a loss the
backend learnt of elsewhere (``GroupFailure.record``, e.g. from the
point-to-point side) wakes every same-host waiter at once, naming the lost rank."""

from __future__ import annotations

import time

import numpy as np
import pytest


from tests.collectives.backends._socket_threads import check_a_loss_told_to_one_rank_wakes_every_waiter, make_backends, run_threads

pytest.importorskip("ndist.collectives.backends.socket.native._cnative")
pytestmark = pytest.mark.timeout(120)


def test_a_loss_told_to_one_rank_wakes_waiters_on_every_rank_naming_the_lost_rank():
    # (the scenario: check_a_loss_told_to_one_rank_wakes_every_waiter; the group's timeout is 60 s)
    backends = make_backends(4, "auto", timeout=60.0, engine="native")
    try:
        run_threads(backends, lambda b: b.barrier(blocking=True).wait(timeout=30))  # native group up
        assert all(b.engine == "native" for b in backends)
        check_a_loss_told_to_one_rank_wakes_every_waiter(backends)
    finally:
        for b in backends:
            b.close()


def _left_before_first_collective(rank, size, folder):
    import os
    from datetime import timedelta

    import ndist.distributed as dist

    dist.init_process_group("socket", timeout=timedelta(seconds=5))
    gone = os.path.join(folder, "gone")
    dist.group.WORLD.backend_for("cpu")  # the backend: its address and native file published
    if rank == 1:
        dist.destroy_process_group()  # its native file goes with the group
        with open(gone, "w"):
            pass
        return None
    deadline = time.monotonic() + 30
    while not os.path.exists(gone) and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        dist.all_reduce(np.ones(4))  # the group's set-up attaches every rank's native file
    except dist.DistError as err:
        return type(err).__name__, str(err), getattr(err, "rank", None)
    return "ok", None, None


@pytest.mark.timeout(120)
def test_a_member_that_closed_before_the_first_collective_is_named(tmp_path):
    """CI run on 2026-11-24 (test_staging's peer failure, once): the first collective
    attached the native engine files of a member that had closed the group and unlinked
    its file, and raised FileNotFoundError (not a DistError, naming no one)."""
    from ndist.testing import run_ranks

    res = run_ranks(_left_before_first_collective, 2, args=(str(tmp_path),), init=False, timeout=90,
                    env={"NDIST_ENGINE": "native"})
    kind, msg, rank = res[0]
    assert kind in ("DistRankFailureError", "DistNetworkError") and rank == 1 and "rank 1" in msg, res[0]
