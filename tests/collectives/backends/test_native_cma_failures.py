"""A native all_to_all that fails after its rank posted blocks by address (single copy,
``process_vm_readv``): the caller's buffer is reused once the call raised, so no peer may
read it afterwards. A timeout used to keep the group (the late peer "finds all it needs
here"), and the late peer then read the timed-out rank's reused buffer: silently wrong
data. Now such a timeout breaks the group (the late peer raises, naming the rank), and
a failing rank waits (at most 1 s) for peers already reading its blocks."""

from __future__ import annotations

import time
from datetime import timedelta

import numpy as np
import pytest

from ndist.testing import run_ranks

pytest.importorskip("ndist.collectives.backends.socket.native._cnative")

N = 256 * 1024  # float32 values per block: 1 MiB, above the single-copy threshold


def _late_reader(rank, size):
    import ndist.distributed as dist

    dist.init_process_group("socket", timeout=timedelta(seconds=2))
    dist.barrier()
    inp = np.full(size * N, rank + 1.0, np.float32)
    out = np.zeros(size * N, np.float32)
    dist.all_to_all_single(out, inp)  # (both ranks probed each other: single copy from here)
    blocks = dist.group.WORLD.backend_for("cpu")._native.g.cma_blocks
    dist.barrier()
    if rank == 1:
        time.sleep(3.0)  # rank 0's all_to_all times out
    first = None
    try:
        dist.all_to_all_single(out, inp)
    except dist.DistError as err:
        first = f"{type(err).__name__}: {err}"
    if rank == 0:
        inp[:] = -7.0  # the caller reuses its buffer once the call raised
        time.sleep(4.0)  # alive while rank 1 comes (its reads need this process)
        return blocks, first, None
    return blocks, first, sorted(set(out[:N].tolist()))


@pytest.mark.timeout(120)
def test_a_late_peer_never_reads_a_timed_out_ranks_reused_buffer():
    res = run_ranks(_late_reader, 2, init=False, timeout=90, env={"NDIST_ENGINE": "native"})
    if res[1][0] == 0:
        pytest.skip("this machine does not let ranks read each other (process_vm_readv)")
    assert res[0][1] is not None and "DistTimeoutError" in res[0][1], res[0]
    blocks, first, got = res[1]
    if first is None:  # it completed: with rank 0's original data only
        assert got == [1.0], res[1]
    else:
        assert "rank 0" in first, res[1]
