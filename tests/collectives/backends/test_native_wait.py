"""How a rank of the native same-host engine waits for a peer: it spins for its spin, then
sleeps on the peer's futex (docs/native.md). A sleep the peer ended soon (within 2 ms)
doubles the rank's spin, up to 10 times ``NDIST_NATIVE_SPIN_US``; a long one sets it back.
So ranks that share cores do not settle into a futex sleep and wake-up on every call."""

from __future__ import annotations

import numpy as np
import pytest

from ndist.testing import run_ranks


def _late_peer(rank, size):
    import time

    import ndist.distributed as dist
    from ndist.runtime import resolve_group

    x = np.ones(4, np.float32)
    dist.barrier()
    g = resolve_group(None).backend_for("cpu")._native.g
    seen = []
    for _ in range(30):
        if rank == 1:
            time.sleep(0.0005)  # past rank 0's 100 µs spin: rank 0 sleeps, and is woken within 2 ms
        dist.all_reduce(x)
        seen.append(g.spin_now_us)
    if rank == 1:
        time.sleep(0.05)  # a peer really late: rank 0's spin goes back to the start
    dist.all_reduce(x)
    return g.spin_us, seen, g.spin_now_us


@pytest.mark.timeout(90)
def test_a_sleep_ended_soon_lengthens_the_spin_and_a_long_one_resets_it():
    pytest.importorskip("ndist.collectives.backends.socket.native._cnative")
    env = {"NDIST_ENGINE": "native", "NDIST_TRANSPORT": "shm", "NDIST_NATIVE_SPIN_US": "100"}
    (base, seen, after), _ = run_ranks(_late_peer, 2, timeout=80, env=env)
    assert base == 100.0
    assert max(seen) > base, seen  # doubled at least once (200, 400, ... up to 1,000)
    assert max(seen) <= 10 * base, seen
    assert after == base, (seen, after)
