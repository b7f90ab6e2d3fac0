"""The start of the SIGSTOP tests with three ranks (tests/reliability/test_stopped_chain_across.py,
test_stopped_wait_outcome.py): A and B survive, S is the rank that stops; B and S share a group."""

from datetime import timedelta

A, B, S = 0, 1, 2
TIMEOUT = 3.0  # the group timeout


def join_with_bs(rank: int):
    """``init_process_group`` (group timeout ``TIMEOUT``), group [B, S], and an all_reduce on
    each, so their connections are up: ``(ndist.distributed, the group [B, S], the array)``."""
    import numpy as np

    import ndist.distributed as dist

    dist.init_process_group("socket", timeout=timedelta(seconds=TIMEOUT))
    bs = dist.new_group([B, S])
    x = np.full(8, rank + 1.0)
    dist.all_reduce(x)
    if rank in (B, S):
        dist.all_reduce(x, group=bs)
    return dist, bs, x
