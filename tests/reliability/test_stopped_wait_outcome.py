"""``Work.wait(timeout)`` of the op running now, timing out about when the op's own deadline
passes (``async_op=False`` waits the group timeout from the call; so does a caller who
passes it): the op's own timeout and grace decide, so the error names the root cause a
notice told. Kill trial seed 7213 (tcp, native): a blocking all_gather behind async ops
raised ``all_gather (#21) did not complete within 3 s; running ...; ranks not heard from:
[2]`` 0.3 s before its own error, which named the stopped rank, could."""

import time

import pytest

from ndist.testing import run_ranks
from tests.reliability.stopped_groups import A, B, S, TIMEOUT, join_with_bs
from tests.stopped_ranks import finish, not_heard_from, open_streams, stop_one


def _wait_outcome(rank, size, folder, queued):
    import numpy as np

    dist, bs, x = join_with_bs(rank)
    open_streams(dist, rank, ((A, B), (B, A)))  # point-to-point streams up
    pids = stop_one(dist, rank, size, S)  # (a survivor continues S once all have raised)
    if rank == S:
        return ("stopped", None, None)
    t0 = time.monotonic()
    outcome = ("ok", None, None)
    try:
        if rank == B:
            time.sleep(0.1)  # (A's deadline first: its grace waits for B's notice)
            dist.all_reduce(x, group=bs)  # waits on S
        else:
            out = np.zeros(8 * size)
            work = dist.all_gather_into_tensor(out, x, async_op=True)  # waits on B
            if queued:  # a blocking op queued behind it: waited the group timeout from the call
                dist.broadcast(np.zeros(8), src=A)
            work.wait(timeout=TIMEOUT)
    except dist.DistError as err:
        outcome = (type(err).__name__, str(err), time.monotonic() - t0)
    finish(folder, rank, (A, B), A, pids[S])
    return outcome


@pytest.mark.timeout(120)
@pytest.mark.parametrize("queued", [False, True], ids=["running", "queued-behind"])
@pytest.mark.parametrize("transport,engine", [("tcp", "python"), ("tcp", "native")])
def test_a_wait_of_the_group_timeout_gives_the_op_its_own_outcome(tmp_path, transport, engine, queued):
    """queued: A's blocking broadcast waits behind the async all_gather (seeds 7305, 7308,
    7315: its message said "running all_gather (#52): done", the running op having failed
    while its description waited for its outcome); it names the running op's error."""
    if engine == "native":
        pytest.importorskip("ndist.collectives.backends.socket.native._cnative")
    res = run_ranks(_wait_outcome, 3, args=(str(tmp_path), queued), init=False, timeout=90,
                    env={"NDIST_TRANSPORT": transport, "NDIST_ENGINE": engine})
    assert res[B][0] == "DistTimeoutError" and not_heard_from(res[B][1]) == [S], res[B]
    kind, msg, waited = res[A]
    assert kind == "DistTimeoutError", res[A]
    assert not_heard_from(msg) == [S] and f"rank {B} (" in msg, res[A]
    assert waited < TIMEOUT + 0.3 + 2.0, res[A]
