"""A stopped (SIGSTOP) rank and a chain of waiters: rank 1 waits on the stopped rank 2,
rank 0 waits on rank 1 (rank 1 is still stuck in the op before). Both deadlines pass
at about the same moment. A rank whose op times out tells its peers which ranks it had
not heard from, and a rank whose deadline passes while it waits on a live rank gives
such a notice a short grace: every survivor's ``DistTimeoutError`` names the stopped
rank (kill trials, seeds 2024 and 2025: rank 0 named rank 1)."""

import os
import re
import time
from datetime import timedelta

import pytest

from ndist.testing import run_ranks

STOPPED = 2


def _chain(rank, size, folder, late):
    import signal

    import numpy as np

    import ndist.distributed as dist

    dist.init_process_group("socket", timeout=timedelta(seconds=3))
    x = np.full(8, rank + 1.0)
    dist.all_reduce(x)  # the mesh is up
    pids = [None] * size
    dist.all_gather_object(pids, os.getpid())
    dist.barrier()
    if rank == STOPPED:
        os.kill(os.getpid(), signal.SIGSTOP)  # rank 0 continues it once both survivors raised
    if rank == late:
        time.sleep(0.15)
    t0 = time.monotonic()
    outcome = ("ok", None, None, None)
    try:
        # rank 1 (root) waits on the stopped rank; rank 0 gives its part, then waits on
        # rank 1 (its ticket, or the broadcast rank 1 never reaches)
        outs = [np.zeros(8) for _ in range(size)] if rank == 1 else None
        dist.gather(x, outs, dst=1)
        y = np.zeros(8)
        dist.broadcast(y, src=1)
    except dist.DistError as err:
        outcome = (type(err).__name__, str(err), time.monotonic() - t0, getattr(err, "rank", None))
    with open(os.path.join(folder, f"done{rank}"), "w"):
        pass
    if rank == 0:
        try:
            deadline = time.monotonic() + 30
            while not os.path.exists(os.path.join(folder, "done1")) and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            os.kill(pids[STOPPED], signal.SIGCONT)
    return outcome


def _not_heard_from(msg):
    m = re.search(r"ranks not heard from: \[([^\]]*)\]", msg)
    return [int(s) for s in m.group(1).split(",")] if m and m.group(1).strip() else None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("late", [1, 0], ids=["waiter-first", "waited-first"])
@pytest.mark.parametrize("transport,engine", [("tcp", "python"), ("shm", "python"), ("auto", "native"),
                                              ("tcp", "native-tcp")])
def test_every_survivor_of_a_chain_names_the_stopped_rank(tmp_path, transport, engine, late):
    """late=1: rank 1 enters 0.15 s late, so rank 0's deadline passes first and it
    waits in its grace for rank 1's notice; late=0: rank 1's notice comes first.
    ``native-tcp``: the native engine over TCP (``NDIST_NATIVE_TCP=1``)."""
    if engine.startswith("native"):
        pytest.importorskip("ndist.collectives.backends.socket.native._cnative")
    env = {"NDIST_TRANSPORT": transport, "NDIST_ENGINE": "native" if engine == "native-tcp" else engine}
    if engine == "native-tcp":
        env["NDIST_NATIVE_TCP"] = "1"
    res = run_ranks(_chain, 3, args=(str(tmp_path), late), init=False, timeout=90, env=env)
    for rank in (0, 1):
        kind, msg, waited, err_rank = res[rank]
        assert kind == "DistTimeoutError", res[rank]
        assert _not_heard_from(msg) == [STOPPED], res[rank]
        assert err_rank in (None, STOPPED), res[rank]
        assert 2.4 < waited < 5.5, res[rank]  # the group timeout is 3 s (+ at most a 0.3 s grace)
    # the waiter says whom it waited on
    assert "rank 1" in res[0][1], res[0]


def _notice_then_healthy_op(rank, size, late_s):
    import numpy as np

    import ndist.distributed as dist

    dist.init_process_group("socket", timeout=timedelta(seconds=3))
    x = np.full(8, rank + 1.0)
    dist.all_reduce(x)
    dist.barrier()
    gathered = None
    if rank == 2:
        time.sleep(late_s)  # late for the gather: rank 1 times out in it and tells its peers
    try:
        outs = [np.zeros(8) for _ in range(size)] if rank == 1 else None
        dist.gather(x, outs, dst=1)
        gathered = "ok"
    except dist.DistError as err:
        gathered = f"{type(err).__name__}: {err}"
    if rank == 0:
        time.sleep(1.0)  # its deadline for the broadcast falls after rank 1 has raised and come
    y = np.full(8, 7.0) if rank == 1 else np.zeros(8)
    t0 = time.monotonic()
    dist.broadcast(y, src=1)  # rank 0 holds rank 1's notice of the gather: it must not fail this op
    return gathered, y.tolist(), time.monotonic() - t0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_timeout_notice_does_not_fail_a_healthy_later_op(transport):
    res = run_ranks(_notice_then_healthy_op, 3, args=(4.5,), init=False, timeout=90,
                    env={"NDIST_TRANSPORT": transport, "NDIST_ENGINE": "python"})
    assert res[0][0] == "ok", res
    assert res[1][0].startswith("DistTimeoutError") and "ranks not heard from: [2]" in res[1][0], res
    for rank in range(3):
        assert res[rank][1] == [7.0] * 8, res  # the broadcast after the timeout works on every rank
