"""How a rank of the native engine waits for a peer: on one host it spins for its spin, then
sleeps on the peer's futex; over TCP it spins, yields for 2 ms, then sleeps in ``poll``
(docs/native.md). A sleep the peer ended soon (within 2 ms) doubles the rank's spin, up to
10 times ``NDIST_NATIVE_SPIN_US``; a long one sets it back (one rule for both engines,
common.h ``spin_learn``). So ranks that share cores do not settle into a sleep and wake-up
on every call."""

from __future__ import annotations

import time

import numpy as np
import pytest

from ndist.testing import run_ranks

from tests.collectives.backends._socket_threads import make_backends, run_threads


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


def _tcp_late_peer(b, late_s):
    g = b.backend._native.g
    x = np.ones(4, np.float32)
    seen = []
    for _ in range(30):
        if b.backend.rank == 1:
            time.sleep(late_s)
        b.all_reduce(x, blocking=True).wait(timeout=30)
        seen.append(g.spin_now_us)
    if b.backend.rank == 1:
        time.sleep(0.05)  # a peer really late: rank 0's spin goes back to the start
    b.all_reduce(x, blocking=True).wait(timeout=30)
    return type(g).__name__, g.spin_us, seen, g.spin_now_us


@pytest.mark.timeout(60)
def test_over_tcp_a_poll_ended_soon_lengthens_the_spin_and_a_long_one_resets_it(monkeypatch):
    # The TCP engine's wait spins, yields for 2 ms, then sleeps in poll: a peer 3 ms late wakes
    # rank 0 from poll within 2 ms (its spin grows); 50 ms late, long after (it resets).
    pytest.importorskip("ndist.collectives.backends.socket.native._cnative")
    monkeypatch.setenv("NDIST_NATIVE_TCP", "1")
    monkeypatch.setenv("NDIST_NATIVE_SPIN_US", "100")
    backends = make_backends(2, "tcp", engine="native")
    try:
        run_threads(backends, lambda b: b.barrier(blocking=True).wait(timeout=30))  # the group up
        out = run_threads(backends, lambda b: _tcp_late_peer(b, 0.003))
    finally:
        for b in backends:
            b.close()
    kind, base, seen, after = out[0]
    assert kind == "TcpGroup"
    assert base == 100.0
    assert max(seen) > base, seen  # doubled at least once (200, 400, ... up to 1,000)
    assert max(seen) <= 10 * base, seen
    assert after == base, (seen, after)


def test_a_tcp_groups_spin_counts_the_ranks_on_this_machine_only():
    """A group over TCP spins when its ranks on this machine have a CPU each: ranks on other
    machines take none of its CPUs (a 64-host job of one rank each spins on an 8-core host);
    network namespaces and containers of one machine share its kernel's boot id, so they count."""
    import os

    from ndist.collectives.backends.socket.native._engine import tcp_spins
    from ndist.runtime._net import host_identity, machine_of

    mine = host_identity()
    assert machine_of(mine) and machine_of(mine) in mine
    assert machine_of("a/1b2c/net:[4026531840]") == machine_of("b/1b2c/net:[4026532001]")  # two namespaces
    assert machine_of("a/1b2c/net:[1]") != machine_of("a/9f8e/net:[1]")  # two machines
    assert machine_of("a//net:[1]") == "a//net:[1]"  # no boot id: the whole identity
    cpus = os.cpu_count() or 1
    assert tcp_spins(1) and tcp_spins(cpus) and not tcp_spins(cpus + 1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [2, 3])
def test_a_tcp_group_on_one_machine_spins_when_its_ranks_have_a_cpu_each(monkeypatch, n):
    pytest.importorskip("ndist.collectives.backends.socket.native._cnative")
    import os

    monkeypatch.setenv("NDIST_NATIVE_TCP", "1")
    monkeypatch.delenv("NDIST_NATIVE_SPIN_US", raising=False)
    backends = make_backends(n, "tcp", engine="native")
    try:
        run_threads(backends, lambda b: b.barrier(blocking=True).wait(timeout=30))
        spins = [b._native.g.spin_us for b in backends]
    finally:
        for b in backends:
            b.close()
    assert spins == [200.0 if n <= (os.cpu_count() or 1) else 0.0] * n
