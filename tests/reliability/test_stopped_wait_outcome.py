"""``Work.wait(timeout)`` of the op running now, timing out about when the op's own deadline
passes (``async_op=False`` waits the group timeout from the call; so does a caller who
passes it): the op's own timeout and grace decide, so the error names the root cause a
notice told. Kill trial seed 7213 (tcp, native): a blocking all_gather behind async ops
raised ``all_gather (#21) did not complete within 3 s; running ...; ranks not heard from:
[2]`` 0.3 s before its own error, which named the stopped rank, could."""

import os
import re
import time
from datetime import timedelta

import pytest

from ndist.testing import run_ranks

A, B, S = 0, 1, 2
TIMEOUT = 3.0


def _wait_outcome(rank, size, folder):
    import signal

    import numpy as np

    import ndist.distributed as dist

    dist.init_process_group("socket", timeout=timedelta(seconds=TIMEOUT))
    bs = dist.new_group([B, S])
    x = np.full(8, rank + 1.0)
    dist.all_reduce(x)
    if rank in (B, S):
        dist.all_reduce(x, group=bs)
    for p, q in ((A, B), (B, A)):  # a point-to-point stream between A and B
        if rank == p:
            dist.send(np.full(4, 1.0), dst=q, tag=7)
        if rank == q:
            dist.recv(np.zeros(4), src=p, tag=7)
    pids = [None] * size
    dist.all_gather_object(pids, os.getpid())
    dist.barrier()
    if rank == S:
        os.kill(os.getpid(), signal.SIGSTOP)  # A continues it once A and B have raised
        return ("stopped", None, None)
    t0 = time.monotonic()
    outcome = ("ok", None, None)
    try:
        if rank == B:
            time.sleep(0.1)  # (A's deadline first: its grace waits for B's notice)
            dist.all_reduce(x, group=bs)  # waits on S
        else:
            out = np.zeros(8 * size)
            dist.all_gather_into_tensor(out, x, async_op=True).wait(timeout=TIMEOUT)  # waits on B
    except dist.DistError as err:
        outcome = (type(err).__name__, str(err), time.monotonic() - t0)
    with open(os.path.join(folder, f"done{rank}"), "w"):
        pass
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(os.path.exists(os.path.join(folder, f"done{r}")) for r in (A, B)):
        time.sleep(0.01)
    if rank == A:
        os.kill(pids[S], signal.SIGCONT)
    return outcome


def _not_heard_from(msg):
    m = re.search(r"ranks not heard from: \[([^\]]*)\]", msg or "")
    return [int(s) for s in m.group(1).split(",")] if m and m.group(1).strip() else None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport,engine", [("tcp", "python"), ("tcp", "native")])
def test_a_wait_of_the_group_timeout_gives_the_op_its_own_outcome(tmp_path, transport, engine):
    if engine == "native":
        pytest.importorskip("ndist.collectives.backends.socket._cnative")
    res = run_ranks(_wait_outcome, 3, args=(str(tmp_path),), init=False, timeout=90,
                    env={"NDIST_TRANSPORT": transport, "NDIST_ENGINE": engine})
    assert res[B][0] == "DistTimeoutError" and _not_heard_from(res[B][1]) == [S], res[B]
    kind, msg, waited = res[A]
    assert kind == "DistTimeoutError", res[A]
    assert _not_heard_from(msg) == [S] and f"rank {B} (" in msg, res[A]
    assert waited < TIMEOUT + 0.3 + 2.0, res[A]
