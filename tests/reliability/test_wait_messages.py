"""What ``Work.wait(timeout)`` says is pending: the first op of a group is not
"queued behind earlier operations"; a later one says how many are ahead."""

import time

import numpy as np
import pytest

from ndist.testing import run_ranks


def _first_op(rank, size):
    import ndist.distributed as dist

    msgs = []
    if rank == 0:
        first = dist.all_reduce(np.ones(4), async_op=True)  # the group's very first op
        try:
            first.wait(timeout=0.001)
        except dist.DistTimeoutError as err:
            msgs.append(str(err))
        second = dist.all_reduce(np.ones(4), async_op=True)
        try:
            second.wait(timeout=0.001)
        except dist.DistTimeoutError as err:
            msgs.append(str(err))
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
