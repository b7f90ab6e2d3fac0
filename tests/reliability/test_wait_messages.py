"""What ``Work.wait(timeout)`` says is pending: the first op of a group is not
"queued behind earlier operations"; a later one says how many are ahead."""

import time

import numpy as np
import pytest

from ndist.testing import run_ranks


def _timed_out(works, timeout: float) -> list:
    """What each of ``works`` says when its ``wait(timeout)`` times out (one that completes
    says nothing)."""
    import ndist.distributed as dist

    msgs = []
    for work in works:
        try:
            work.wait(timeout=timeout)
        except dist.DistTimeoutError as err:
            msgs.append(str(err))
    return msgs


def _first_op(rank, size):
    import ndist.distributed as dist

    msgs = []
    if rank == 0:
        first = dist.all_reduce(np.ones(4), async_op=True)  # the group's very first op
        msgs += _timed_out([first], 0.001)
        second = dist.all_reduce(np.ones(4), async_op=True)
        msgs += _timed_out([second], 0.001)
        dist.send(np.zeros(1), dst=1)  # now rank 1 joins
        first.wait()
        second.wait()
    else:
        dist.recv(np.zeros(1), src=0)
        time.sleep(0.2)
        dist.all_reduce(np.ones(4))
        dist.all_reduce(np.ones(4))
    return msgs


@pytest.mark.timeout(60)
def test_first_op_timeout_does_not_claim_earlier_operations():
    first, second = run_ranks(_first_op, 2, timeout=40)[0]
    assert "all_reduce (#1) did not complete within 0.001 s" in first, first
    assert "earlier operation" not in first, first
    assert "all_reduce (#2)" in second and "behind 1 earlier operation" in second, second


def _late_peer_waits(rank, size):
    import ndist.distributed as dist

    msgs = []
    if rank == 0:
        first = dist.all_reduce(np.ones(4), async_op=True)
        second = dist.all_reduce(np.ones(4), async_op=True)  # queued behind the first
        y = np.zeros(4)
        rec = dist.irecv(y, src=1, tag=5)
        msgs = _timed_out((second, rec), 0.5)
        dist.send(np.zeros(1), dst=1)  # now rank 1 joins
        first.wait()
        second.wait()
        rec.wait()
    else:
        dist.recv(np.zeros(1), src=0)
        dist.all_reduce(np.ones(4))
        dist.all_reduce(np.ones(4))
        dist.send(np.ones(4), dst=0, tag=5)
    return msgs


# Found by tools/trials/kill_trials.py's SIGSTOP trials: a survivor waiting on a queued
# collective, or on an irecv, got "reduce_scatter (#191) did not complete within 3 s;
# queued behind 1 earlier operation on this group" / "recv (#-1) did not complete
# within 3 s": neither names the stopped rank (a running collective's message does).
@pytest.mark.timeout(60)
def test_a_wait_timeout_of_a_queued_op_or_a_recv_names_the_rank_not_heard_from():
    queued, recv = run_ranks(_late_peer_waits, 2, timeout=40)[0]
    assert "all_reduce (#2)" in queued and "queued behind 1 earlier operation" in queued, queued
    assert "ranks not heard from: [1]" in queued, queued  # those of the op it waits behind
    assert "recv" in recv and "from rank 1 (tag 5)" in recv and "ranks not heard from: [1]" in recv, recv


def _any_source_wait(rank, size):
    import ndist.distributed as dist

    msg = ""
    if rank == 0:
        rec = dist.irecv(np.zeros(2), tag=3)  # any source
        msg = "".join(_timed_out([rec], 0.3))
        dist.send(np.zeros(1), dst=1)
        rec.wait()
    else:
        dist.recv(np.zeros(1), src=0)
        dist.send(np.ones(2), dst=0, tag=3)
    return msg


@pytest.mark.timeout(60)
def test_a_wait_timeout_of_an_any_source_recv_says_so():
    msg = run_ranks(_any_source_wait, 2, timeout=40)[0]
    assert "from any source (tag 3)" in msg, msg


def _subgroup_waits(rank, size):
    import ndist.distributed as dist

    g = dist.new_group([0, 2])
    msgs = []
    if rank == 0:
        first = dist.all_reduce(np.ones(4), group=g, async_op=True)
        second = dist.all_reduce(np.ones(4), group=g, async_op=True)
        rec = dist.irecv(np.zeros(4), src=2, group=g, tag=1)
        msgs = _timed_out((first, second, rec), 0.5)
        dist.send(np.zeros(1), dst=2)
        first.wait()
        second.wait()
        rec.wait()
    elif rank == 2:
        dist.recv(np.zeros(1), src=0)
        dist.all_reduce(np.ones(4), group=g)
        dist.all_reduce(np.ones(4), group=g)
        dist.send(np.ones(4), dst=0, group=g, tag=1)
    return msgs


@pytest.mark.timeout(60)
def test_wait_timeouts_in_a_subgroup_name_global_ranks():
    # group [0, 2]: group rank 1 is global rank 2; global rank 1 is not a member
    first, second, rec = run_ranks(_subgroup_waits, 3, timeout=40)[0]
    for msg in (first, second, rec):
        assert "[2]" in msg and "[1]" not in msg, msg
    assert "rank 2 (tag 1)" in rec, rec
