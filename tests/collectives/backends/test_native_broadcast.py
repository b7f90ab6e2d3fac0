"""The native engine's broadcast root is eager (#19): it returns once its pieces are
posted, without waiting for the receivers to post theirs (as MPI's and NCCL's roots may
complete before the receivers call). What the receivers' posts told it before (the same
call on every rank? every receiver alive?) it learns at its next op on the group, which
first waits until every receiver joined the broadcast: a mismatch or a dead receiver is
raised there, naming the peer, and the group is broken. The receivers raise as before, in
their call. The root's data goes through its slots, so its buffer is the caller's again
at return."""

from __future__ import annotations

import time

import numpy as np
import pytest

from ndist.testing import run_ranks
from tests.collectives.backends._socket_bodies import broadcast_to_a_dead_receiver
from tests.kill_sync import run_with_victim

pytest.importorskip("ndist.collectives.backends.socket.native._cnative")

SLOW = 1.5  # seconds a receiver sleeps before it calls


def _ahead(rank, size, count):
    import ndist.distributed as dist

    dist.barrier()
    buf = np.arange(count, dtype=np.float32) if rank == 0 else np.zeros(count, np.float32)
    took, first_ok = None, True
    if rank == 0:
        t0 = time.monotonic()
        dist.broadcast(buf, src=0)  # returns before the receivers call
        took = time.monotonic() - t0
        buf[:] = -1.0  # the caller's buffer again: the receivers still get the data it had
        dist.broadcast(buf, src=0)  # the next op: waits until they joined the first one
    else:
        time.sleep(SLOW)
        dist.broadcast(buf, src=0)
        first_ok = buf.tolist() == list(range(count))
        dist.broadcast(buf, src=0)
    dist.barrier()
    return took, first_ok, bool((buf == -1.0).all())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size,count", [(2, 1024), (3, 1024), (2, 2048)], ids=["2-ranks", "3-ranks", "2-pieces"])
def test_the_root_returns_before_a_slow_receiver_calls(size, count):
    env = {"NDIST_ENGINE": "native"}
    if count == 2048:  # 8 KiB over 4 KiB slots: two pieces, both posted before any receiver came
        env["NDIST_NATIVE_SLOT"] = "4096"
    res = run_ranks(_ahead, size, args=(count,), timeout=90, env=env)
    took = res[0][0]
    assert took < SLOW * 0.5, res  # it did not wait for the receivers (they came SLOW s later)
    for rank, (_, first_ok, second_ok) in enumerate(res):
        assert first_ok and second_ok, (rank, res)


def _mismatch(rank, size, case):
    import ndist.distributed as dist

    dist.barrier()
    x = np.ones(8, np.float32)
    in_call = after = again = None
    try:
        if rank == 0:
            dist.broadcast(x, src=0)
        elif case == "op":
            dist.all_reduce(x)
        elif case == "root":
            dist.broadcast(x, src=1)  # another root: both roots return at once
        else:
            dist.broadcast(np.ones(16, np.float32), src=0)  # another size
    except dist.DistMismatchError as err:
        in_call = str(err)
    t0 = time.monotonic()
    try:
        dist.broadcast(x, src=0)  # the root's next op
    except dist.DistError as err:
        after = (type(err).__name__, str(err), getattr(err, "rank", None))
    took = time.monotonic() - t0
    try:
        dist.barrier()
    except dist.DistError as err:
        again = (type(err).__name__, str(err))
    return in_call, after, again, took


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["op", "root", "size"])
def test_a_mismatch_is_raised_by_the_root_at_its_next_op(case):
    res = run_ranks(_mismatch, 2, args=(case,), timeout=90, env={"NDIST_ENGINE": "native"})
    (in0, after0, again0, took0), (in1, after1, again1, _) = res
    theirs = {"op": "rank 1: all_reduce float32[8] SUM #2", "root": "rank 1: broadcast float32[8] root=1 #2",
              "size": "rank 1: broadcast float32[16] root=0 #2"}[case]
    # the root returned; its next op names both calls (the broadcast it had returned from)
    assert in0 is None, res
    assert after0 is not None and after0[0] == "DistMismatchError", res
    assert "rank 0: broadcast float32[8] root=0 #2" in after0[1] and theirs in after0[1], after0
    assert "rank 0: broadcast float32[8] root=0 #3" in after0[1], after0  # where it was found
    assert took0 < 5, res
    # the group is broken on the root: a later op raises the same error again
    assert again0 == ("DistMismatchError", after0[1]), res
    if case == "root":  # rank 1 was a root too: the same, the other way round
        assert in1 is None and after1[0] == "DistMismatchError", res
        assert "rank 1: broadcast float32[8] root=1 #2" in after1[1], res
    else:  # a receiver raises in its call, as before
        assert in1 is not None and "rank 0: broadcast float32[8] root=0 #2" in in1 and theirs in in1, res
        assert after1 is not None and after1[2] in (0, None) and "rank 0" in after1[1], res


@pytest.mark.timeout(120)
def test_a_dead_receiver_is_named_by_the_root_at_its_next_op(tmp_path):
    # rank 1 calls 0.5 s late: rank 2 is gone by the time the root calls; the root posts
    # and returns, and its next op waits for every receiver of the first: names rank 2
    res = run_with_victim(broadcast_to_a_dead_receiver, 3, 2, tmp_path, 1024, 0.5, term_timeout=8, timeout=100,
                          NDIST_ENGINE="native")
    assert res.launcher_exitcode != 0, res
    rec = res[0]
    # the root's own broadcast may already fail (its backend heard of the loss elsewhere):
    # either way it names rank 2, within 1 s of the op that raises (2 s: a loaded machine)
    err = rec["first"] or rec["next"]
    assert isinstance(err, list) and err[0] in ("DistRankFailureError", "DistNetworkError") and err[2] == 2 and "rank 2" in err[1], rec
    assert rec["next_s"] < 2.0, rec
