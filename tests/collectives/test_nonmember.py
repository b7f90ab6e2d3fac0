"""A collective on a group this rank is not in: None, tensors untouched, one warning per group (torch)."""

from __future__ import annotations

import pytest

from ndist.testing import run_ranks

pytestmark = pytest.mark.timeout(120)


def _outsider(rank, world_size):
    import logging

    import numpy as np

    import ndist.distributed as dist

    seen = []

    class Catch(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    logging.getLogger("ndist.collectives").addHandler(Catch())
    g1, g2 = dist.new_group([0]), dist.new_group([0])
    if rank == 0:
        return None
    x = np.arange(3.0)
    results = [dist.all_reduce(x, group=g1), dist.broadcast(x, src=0, group=g1),
               dist.all_to_all_single(np.empty(3), x, group=g1), dist.barrier(group=g1),
               dist.recv(x, src=0, group=g1), dist.all_reduce(x, group=g2)]
    return results, x.tolist(), seen


def test_nonmember_calls_return_none_and_warn_once_per_group():
    _, (results, x, seen) = run_ranks(_outsider, 2, timeout=60)
    assert results == [None, None, None, None, -1, None]
    assert x == [0.0, 1.0, 2.0]
    assert len(seen) == 2, seen  # g1 once (five calls), g2 once
    assert "not a member" in seen[0] and "returns None" in seen[0]
