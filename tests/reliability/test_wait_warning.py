"""A collective that waits long logs why (issue 14, item 9): after
NDIST_WAIT_WARNING seconds (default 60), one warning a minute naming the op,
its sequence number and the ranks not heard from."""

import pytest

from ndist.testing import run_ranks

pytestmark = pytest.mark.timeout(120)


def _late_rank(rank, size, late):
    import logging
    import time

    import numpy as np

    import ndist.distributed as dist

    records = []

    class _Keep(logging.Handler):
        def emit(self, record):
            records.append((record.name, record.getMessage()))

    logging.getLogger("ndist").addHandler(_Keep(level=logging.WARNING))
    dist.barrier()  # #1: the mesh is up
    if rank == late:
        time.sleep(2.5)
    x = np.ones(4)
    dist.all_reduce(x)  # #2
    assert (x == size).all()
    return records


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_a_long_wait_is_logged_once_naming_op_seq_and_missing_ranks(transport):
    res = run_ranks(_late_rank, 3, args=(2,), env={"NDIST_WAIT_WARNING": "0.5"}, transport=transport, timeout=60)
    for rank in (0, 1):
        # (the barrier may warn too when a rank starts late on a busy machine: not counted)
        warned = [m for name, m in res[rank] if "has waited" in m and "all_reduce" in m]
        assert len(warned) == 1, res[rank]  # one a minute: the next would come at 60.5 s
        msg = warned[0]
        assert f"rank {rank}: all_reduce float64[4] SUM #2" in msg, msg
        assert "ranks not heard from: [2]" in msg, msg
    assert not [m for name, m in res[2] if "has waited" in m and "all_reduce" in m], res[2]


def test_no_warning_below_the_default_threshold():
    res = run_ranks(_late_rank, 2, args=(1,), timeout=60)
    assert not [m for r in res for name, m in r if "has waited" in m], res
