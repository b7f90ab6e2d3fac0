"""The native engine's two levels (``native/_twolevel.py``): which groups run them, every op
on layouts the conformance suite does not give (hosts of interleaved ranks, uneven hosts,
roots that are not leaders), mismatches between calls whose steps look alike, and failures
told across the levels. Ranks are threads of this process over real sockets and shared
memory; ``NDIST_NATIVE_HOSTS`` makes the engine take one host's ranks for several hosts
(the conformance suite runs it as ``socket-native-2level``; across real network namespaces:
tests/collectives/test_three_hosts_netns.py)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from ndist.collectives import ReduceOp
from ndist.runtime import DistMismatchError, DistNetworkError, DistTimeoutError

from tests.collectives.backends._socket_threads import make_backends, run_threads

pytest.importorskip("ndist.collectives.backends.socket.native._cnative")
pytestmark = pytest.mark.timeout(120)


def _kind(b) -> str:
    nat = b.backend._native
    return type(nat.g).__name__ if nat is not None else "python"


@pytest.fixture(autouse=True)
def _every_call_in_two_levels(monkeypatch):
    """The tests' buffers are small: every call in two levels, unless a test says otherwise."""
    monkeypatch.setenv("NDIST_NATIVE_TWO_LEVEL_MIN", "0")


def _up(n, timeout=30.0):
    backends = make_backends(n, "auto", timeout=timeout)
    run_threads(backends, lambda b: b.barrier(blocking=True).wait(timeout=30))
    return backends


def _close(backends):
    for b in backends:
        b.close()


@pytest.mark.parametrize("hosts,want", [("2", "TwoLevelGroup"), ("mod:2", "TwoLevelGroup"),
                                        ("1", "TcpGroup"), ("", "Group")])
def test_the_engine_a_group_runs_on_by_its_hosts(monkeypatch, hosts, want):
    """Hosts of 2 ranks: the two levels; one rank per host: the direct TCP engine (no host
    has a second rank); one host: the same-host engine."""
    monkeypatch.setenv("NDIST_NATIVE_HOSTS", hosts)
    backends = _up(4)
    try:
        assert [_kind(b) for b in backends] == [want] * 4
        assert [b.engine for b in backends] == ["native"] * 4
    finally:
        _close(backends)


def test_the_two_level_group_runs_every_rank_on_the_other_hosts_tcp_leaders_only(monkeypatch):
    monkeypatch.setenv("NDIST_NATIVE_HOSTS", "mod:2")
    backends = _up(5)
    try:
        g = [b.backend._native.g for b in backends]
        assert [x.hosts for x in g] == [(0, 1, 0, 1, 0)] * 5
        assert [x.leaders for x in g] == [(0, 1)] * 5
        assert [x.is_leader for x in g] == [True, True, False, False, False]
        assert [x.local is not None for x in g] == [True] * 5
    finally:
        _close(backends)


def _every_op(b):
    """Every op, roots on every rank, list and single-buffer forms; returns what differs
    from NumPy's answer (empty: none)."""
    r, n = b.backend.rank, b.backend.size
    bad = []

    def check(name, got, want):
        if not np.array_equal(got, want):
            bad.append((name, got.tolist() if got.size < 20 else got[:8].tolist()))

    x = np.arange(7, dtype=np.float64) + r
    b.all_reduce(x, ReduceOp.SUM, blocking=True).wait(30)
    check("all_reduce", x, n * np.arange(7.0) + n * (n - 1) / 2)
    big = np.full(300_000, r + 1, np.int32)  # several slots, the leaders' reduce-scatter form
    b.all_reduce(big, ReduceOp.SUM, blocking=True).wait(30)
    check("all_reduce big", big[:3], np.full(3, n * (n + 1) // 2, np.int32))
    m = np.array([r, -r], np.int64)
    b.all_reduce(m, ReduceOp.MAX, blocking=True).wait(30)
    check("all_reduce max", m, np.array([n - 1, 0]))
    avg = np.full(4, float(r))
    b.all_reduce(avg, ReduceOp.AVG, blocking=True).wait(30)
    check("all_reduce avg", avg, np.full(4, (n - 1) / 2))
    for src in range(n):
        y = np.full(5, r, np.int16)
        b.broadcast(y, src, blocking=True).wait(30)
        check(f"broadcast {src}", y, np.full(5, src, np.int16))
        z = np.full(70_000, r, np.float32)  # more than a slot
        b.broadcast(z, src, blocking=True).wait(30)
        check(f"broadcast big {src}", z[-3:], np.full(3, src, np.float32))
    for dst in range(n):
        y = np.full(3, r + 1, np.int64)
        b.reduce(y, dst, ReduceOp.SUM, blocking=True).wait(30)
        check(f"reduce {dst}", y, np.full(3, n * (n + 1) // 2 if r == dst else r + 1))  # a non-root's stays
        w = np.full(5, r + 0.5, np.float32)  # the leader's kept copy again, at another dtype and size
        b.reduce(w, dst, ReduceOp.MAX, blocking=True).wait(30)
        check(f"reduce max {dst}", w, np.full(5, n - 0.5 if r == dst else r + 0.5, np.float32))
    out = np.zeros(3 * n, np.int32)
    b.all_gather_into(out, np.full(3, r, np.int32), blocking=True).wait(30)
    check("all_gather_into", out, np.repeat(np.arange(n, dtype=np.int32), 3))
    outs = [np.zeros(2, np.uint8) for _ in range(n)]
    b.all_gather(outs, np.full(2, r, np.uint8), blocking=True).wait(30)
    check("all_gather list", np.concatenate(outs), np.repeat(np.arange(n, dtype=np.uint8), 2))
    a2a = np.zeros(n, np.int64)
    b.all_to_all_single(a2a, np.arange(n) + 10 * r, blocking=True).wait(30)
    check("all_to_all", a2a, np.arange(n) * 10 + r)
    rs = np.zeros(2, np.float32)
    b.reduce_scatter(rs, [np.full(2, r + j, np.float32) for j in range(n)], ReduceOp.SUM, blocking=True).wait(30)
    check("reduce_scatter", rs, np.full(2, n * r + n * (n - 1) / 2, np.float32))
    for root in (0, n - 1):
        g = [np.zeros(1, np.int32) for _ in range(n)] if r == root else None
        b.gather(g, np.full(1, r, np.int32), root, blocking=True).wait(30)
        if r == root:
            check("gather", np.concatenate(g), np.arange(n, dtype=np.int32))
        s = np.zeros(2, np.int32)
        b.scatter(s, [np.full(2, j, np.int32) for j in range(n)] if r == root else None, root,
                  blocking=True).wait(30)
        check("scatter", s, np.full(2, r, np.int32))
    b.barrier(blocking=True).wait(30)
    return bad


@pytest.mark.parametrize("hosts,n", [("2", 4), ("2", 5), ("mod:2", 4), ("mod:3", 5), ("3", 7)])
def test_every_op_on_two_levels_matches_numpy(monkeypatch, hosts, n):
    """Consecutive and interleaved hosts, uneven ones, and a host of one rank ("3" at 7
    ranks: hosts of 3, 3 and 1)."""
    monkeypatch.setenv("NDIST_NATIVE_HOSTS", hosts)
    backends = _up(n)
    try:
        assert _kind(backends[0]) == "TwoLevelGroup"
        assert run_threads(backends, _every_op, timeout=90) == [[]] * n
    finally:
        _close(backends)


def _both(b, ops: dict):
    """Rank r runs ``ops[r]`` (default: an all_reduce of 8 floats); returns its error."""
    x = np.ones(8, np.float32)
    try:
        ops.get(b.backend.rank, lambda b, x: b.all_reduce(x, ReduceOp.SUM, blocking=True))(b, x).wait(30)
    except Exception as err:  # noqa: BLE001
        return err
    return None


def test_calls_whose_shared_memory_steps_look_alike_are_a_mismatch(monkeypatch):
    """Rank 0 calls reduce(dst=0), rank 1 (its host) all_reduce: both first reduce to their
    leader in shared memory, alike but for the call each step belongs to (its tag). Both
    raise a mismatch naming the two calls; the other host raises naming a rank of the first
    host, and no rank hangs."""
    monkeypatch.setenv("NDIST_NATIVE_HOSTS", "2")
    backends = _up(4, timeout=20)
    try:
        errs = run_threads(backends, lambda b: _both(b, {0: lambda b, x: b.reduce(x, 0, ReduceOp.SUM,
                                                                                   blocking=True)}))
        for r in (0, 1):
            assert isinstance(errs[r], DistMismatchError), errs
            assert "reduce" in str(errs[r]) and "all_reduce" in str(errs[r]), str(errs[r])
        for r in (2, 3):
            assert isinstance(errs[r], DistNetworkError) and errs[r].rank in (0, 1), errs[r]
    finally:
        _close(backends)


def test_a_broadcast_from_another_root_on_the_same_host_is_a_mismatch(monkeypatch):
    """Rank 2 broadcasts from rank 1, the others from rank 0 (both on the first host): the
    leaders' steps alike (the first host's leader sends either way) but for the call's root
    in every step's tag. Rank 2 raises the mismatch naming both roots, rank 3 (waiting on
    it) names rank 2; the first host got what it asked for (a root returns once its data is
    sent, as over MPI) and its next collective raises, naming a rank of the other host."""
    monkeypatch.setenv("NDIST_NATIVE_HOSTS", "2")
    backends = _up(4, timeout=20)
    try:
        bc = {r: (lambda src: lambda b, x: b.broadcast(x, src, blocking=True))(1 if r == 2 else 0) for r in range(4)}
        errs = run_threads(backends, lambda b: _both(b, bc))
        assert errs[:2] == [None, None], errs
        assert isinstance(errs[2], DistMismatchError), errs
        assert "root=1" in str(errs[2]) and "root=0" in str(errs[2]), str(errs[2])
        assert isinstance(errs[3], DistNetworkError) and errs[3].rank == 2, errs[3]
        nxt = run_threads(backends[:2], lambda b: _both(b, {}))  # (rank 0 reads rank 2's notice of the mismatch)
        assert isinstance(nxt[0], DistMismatchError) and "rank 2: broadcast" in str(nxt[0]), nxt
        assert isinstance(nxt[1], DistNetworkError) and nxt[1].rank == 0, nxt
    finally:
        _close(backends)


def _sized_all_reduce(count):
    return lambda b, x: b.all_reduce(np.ones(count, np.float32), ReduceOp.SUM, blocking=True)


def _sizes_across(monkeypatch, counts):
    """Every rank all_reduces ``counts[rank]`` float32s at 2 hosts x 2 with a 4 KiB two-level
    minimum (256: direct, 2048: two levels); the errors, and the seconds they took."""
    monkeypatch.setenv("NDIST_NATIVE_HOSTS", "2")
    monkeypatch.setenv("NDIST_NATIVE_TWO_LEVEL_MIN", "4096")
    backends = _up(4, timeout=60)
    try:
        t0 = time.monotonic()
        errs = run_threads(backends, lambda b: _both(b, {r: _sized_all_reduce(counts[r]) for r in range(4)}))
        return errs, time.monotonic() - t0
    finally:
        _close(backends)


def test_a_size_across_the_two_level_minimum_is_a_mismatch_not_a_timeout(monkeypatch):
    """Rank 3 all_reduces 1 KiB (below the minimum: direct, to every rank over TCP), the
    others 8 KiB (in two levels). The first rank to look finds rank 3's frame of this op at
    the head of a stream: rank 0 in the leaders' step (from a rank outside the leaders'
    view), or rank 1 or 2 waiting in shared memory (the TCP group's news; rank 1 is outside
    the view). A mismatch naming rank 3's call, told to every rank, long before the group
    timeout."""
    errs, took = _sizes_across(monkeypatch, [2048, 2048, 2048, 256])
    assert took < 20, took
    assert isinstance(errs[3], DistMismatchError) and "float32[2048]" in str(errs[3]), errs
    assert any(isinstance(errs[r], DistMismatchError) and "rank 3: all_reduce float32[256]" in str(errs[r])
               for r in (0, 1, 2)), errs
    for r in (0, 1, 2):  # (the others: the mismatch relayed, or the rank that failed their step)
        assert isinstance(errs[r], (DistMismatchError, DistNetworkError)), errs


@pytest.mark.parametrize("counts", [[256, 256, 256, 2048], [256, 2048, 256, 2048]],
                         ids=["one-rank-in-two-levels", "leaders-direct"])
def test_a_rank_in_two_levels_finds_the_frames_of_ranks_that_run_the_call_direct(monkeypatch, counts):
    """The other way round: ranks that are no leaders run the call in two levels (8 KiB) and
    wait in shared memory on their leader, which runs it direct (1 KiB) and waits on them over
    TCP. The first to look finds, in its shared-memory wait, the TCP group's frame of this op
    sent to it, a rank outside the leaders' view (``Group.watch``): a mismatch naming the
    direct call, which its FAIL frames tell every rank. Before, every rank raised
    DistTimeoutError at the group timeout (60 s here)."""
    errs, took = _sizes_across(monkeypatch, counts)
    assert took < 20, took
    for r in range(4):  # (the others: the mismatch relayed, or the rank that failed their step)
        assert isinstance(errs[r], (DistMismatchError, DistNetworkError)), errs
    assert any(isinstance(errs[r], DistMismatchError) and "float32[256]" in str(errs[r])
               for r in (1, 3) if counts[r] == 2048), errs


def test_a_kept_mismatch_of_a_direct_op_keeps_the_two_level_group(monkeypatch):
    """Hosts of 2 and 1 ranks; rank 0 calls barrier, ranks 1 and 2 all_to_all, both direct
    (one phase: each rank sends every other one frame and reads one from each). Every rank
    raises the mismatch and the TcpGroup keeps the group (docs/native.md): so does the
    two-level group, and the next all_reduce completes on every rank. (Had the first host's
    ranks broken their same-host group for it, rank 2, alone on its host, would have gone on
    into the all_reduce and waited for them until the group timeout.)"""
    monkeypatch.setenv("NDIST_NATIVE_HOSTS", "2")
    monkeypatch.setenv("NDIST_NATIVE_TWO_LEVEL_MIN", "4096")
    backends = _up(3, timeout=20)
    try:
        def run(b):
            r = b.backend.rank
            err = None
            try:
                if r == 0:
                    b.barrier(blocking=True).wait(30)
                else:
                    b.all_to_all([np.zeros(2, np.float32) for _ in range(3)],
                                 [np.ones(2, np.float32) for _ in range(3)], blocking=True).wait(30)
            except DistMismatchError as e:
                err = str(e)
            x = np.full(4, r + 1.0, np.float32)
            b.all_reduce(x, ReduceOp.SUM, blocking=True).wait(30)
            return err, x.tolist()

        t0 = time.monotonic()
        got = run_threads(backends, run)
        assert time.monotonic() - t0 < 15
        for err, x in got:
            assert err and "barrier" in err and "all_to_all" in err, got
            assert x == [6.0] * 4, got
    finally:
        _close(backends)


def test_a_rank_that_never_calls_is_named_by_every_rank_on_both_hosts(monkeypatch):
    """Rank 3 (the second host's non-leader) never calls the all_reduce: its leader times out
    waiting on it in shared memory, and the timeout is told across the levels, so the first
    host's ranks (waiting over TCP and in shared memory) name rank 3 too, each with a
    DistTimeoutError, at about the group timeout."""
    monkeypatch.setenv("NDIST_NATIVE_HOSTS", "2")
    backends = _up(4, timeout=3)
    try:
        t0 = time.monotonic()
        errs = run_threads(backends[:3], lambda b: _both(b, {}))
        took = time.monotonic() - t0
        for r in range(3):
            assert isinstance(errs[r], DistTimeoutError), (r, errs[r])
            assert "ranks not heard from: [3]" in str(errs[r]), (r, str(errs[r]))
        assert took < 3 * 3, took
    finally:
        _close(backends)


def test_a_loss_learnt_elsewhere_wakes_both_levels(monkeypatch):
    """Ranks 0-2 wait in an all_reduce for rank 3; rank 2 (rank 3's leader, waiting on it in
    shared memory) learns from elsewhere that rank 3 is lost: it fails both its groups, so
    rank 0 (waiting on rank 2 over TCP) and rank 1 (waiting on rank 0 in shared memory)
    raise naming rank 3 at once, not at the timeout."""
    monkeypatch.setenv("NDIST_NATIVE_HOSTS", "2")
    backends = _up(4, timeout=60)
    try:
        import threading

        errs = [None] * 3

        def wait(r):
            errs[r] = _both(backends[r], {})

        threads = [threading.Thread(target=wait, args=(r,), daemon=True) for r in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        t0 = time.monotonic()
        backends[2].failure.record(3, "h3", "lost point-to-point connection to rank 3 (h3): reset")
        for t in threads:
            t.join(30)
        assert time.monotonic() - t0 < 10
        for r in range(3):
            assert isinstance(errs[r], DistNetworkError) and errs[r].rank == 3, (r, errs[r])
    finally:
        _close(backends)


def test_a_loss_learnt_on_another_host_wakes_a_rank_waiting_in_shared_memory(monkeypatch):
    """Rank 2 (the second host's leader) is late to an all_reduce; rank 3 waits on it in
    shared memory, where no TCP frame is read. Rank 0, on the other host, learns from
    elsewhere that rank 2 is lost and fails its TCP group: its FAIL frame reaches rank 3's
    stream, which rank 3's shared-memory wait looks at (``Group.watch``, every 100 ms), so
    rank 3 raises naming rank 2 at once. Before, it waited for rank 2 until the group
    timeout (60 s here)."""
    monkeypatch.setenv("NDIST_NATIVE_HOSTS", "2")
    backends = _up(4, timeout=60)
    try:
        import threading

        errs = {}

        def wait(r):
            errs[r] = _both(backends[r], {})

        threads = {r: threading.Thread(target=wait, args=(r,), daemon=True) for r in (0, 1, 3)}
        for t in threads.values():
            t.start()
        time.sleep(0.5)
        backends[0].failure.record(2, "h2", "lost point-to-point connection to rank 2 (h2): reset")
        threads[3].join(30)
        assert isinstance(errs.get(3), DistNetworkError) and errs[3].rank == 2, errs
        assert "rank 2" in str(errs[3]), str(errs[3])
        for r in (0, 1):
            threads[r].join(30)
            assert isinstance(errs.get(r), DistNetworkError) and errs[r].rank == 2, (r, errs)
    finally:
        _close(backends)


def test_a_loss_learnt_between_two_steps_of_an_op_is_its_error(monkeypatch):
    """A kill trial across 2 hosts of 2 (continue mode, seeds 510014, 510026, 510030): a
    survivor that is no leader raised ``RuntimeError: native group is broken by an earlier
    failure``, not a DistError. The loss watcher's thread had failed both compiled groups
    (``mark_lost``) after the op's first step returned and before its second began. The steps
    run in C (``ctwo.c``) with the GIL released, so the watcher may still come between two of
    them; the next step then refuses to run, as every step does on a broken group. Here the
    loss comes just before rank 1's (the first host's non-leader) all_gather enters C: its
    first step refuses, and the op raises the loss, naming the lost rank."""
    monkeypatch.setenv("NDIST_NATIVE_HOSTS", "2")
    backends = _up(4, timeout=20)
    try:
        tl = backends[1].backend._native.g
        real, done = tl.all_gather, []

        def all_gather(*args):
            if not done:  # as the watcher's thread would, with the op's steps about to run
                done.append(1)
                backends[1].backend._native_loss(3, "h3", "lost point-to-point connection to rank 3 (h3)")
            return real(*args)

        monkeypatch.setattr(tl, "all_gather", all_gather)

        def gather(b):
            outs = [np.zeros(2, np.float32) for _ in range(4)]
            try:
                b.all_gather(outs, np.full(2, b.backend.rank, np.float32), blocking=True).wait(30)
            except Exception as err:  # noqa: BLE001
                return err
            return None

        errs = run_threads(backends, gather)
        assert done and isinstance(errs[1], DistNetworkError) and errs[1].rank == 3, errs
        assert "rank 3" in str(errs[1]), str(errs[1])
    finally:
        _close(backends)


def test_a_loss_learnt_during_the_set_up_barrier_is_its_error(monkeypatch):
    """A kill trial across 2 hosts of 2 (continue mode, seed 530005, 3 runs in 25): a
    survivor's first collective on a subgroup raised ``RuntimeError: native group is broken
    by an earlier failure``. The loss watcher had failed the new group's compiled groups
    (``mark_lost``) after its hook was in place and before the set-up barrier's first step,
    which refused to run; the set-up handled only the engine's own errors. Here the hook runs
    at that moment on rank 1: its first collective raises the loss, naming the lost rank, and
    no rank raises anything but a DistError."""
    from ndist.collectives.backends.socket.native import _twolevel
    from ndist.runtime import DistError

    monkeypatch.setenv("NDIST_NATIVE_HOSTS", "2")
    backends = make_backends(4, "auto", timeout=20)
    real, done = _twolevel.TwoLevelGroup.barrier, []

    def barrier(self):
        if self.rank == 1 and not done:  # the set-up barrier: as the watcher's thread would, just before it
            done.append(1)
            backends[1].backend._native_loss(3, "h3", "lost point-to-point connection to rank 3 (h3)")
        return real(self)

    monkeypatch.setattr(_twolevel.TwoLevelGroup, "barrier", barrier)
    try:
        errs = run_threads(backends, lambda b: _both(b, {}))
        assert done and isinstance(errs[1], DistNetworkError) and errs[1].rank == 3, errs
        assert all(isinstance(e, DistError) for e in errs), errs
    finally:
        _close(backends)


def test_calls_below_the_two_level_minimum_run_direct_and_above_it_in_two_levels(monkeypatch):
    """``NDIST_NATIVE_TWO_LEVEL_MIN``: a call of fewer bytes runs on the whole TCP group (its
    view every rank), a larger one on the leaders' view, set on every rank (those outside it
    run no TCP step, and take this op's frames sent to them for a mismatch); both give the
    same answer. A TCP op on a rank outside the view is refused."""
    monkeypatch.setenv("NDIST_NATIVE_HOSTS", "2")
    monkeypatch.setenv("NDIST_NATIVE_TWO_LEVEL_MIN", "4096")
    backends = _up(4)
    try:
        assert [b.backend._native.g.two_level_min for b in backends] == [4096] * 4

        def views(b, count):
            x = np.full(count, b.backend.rank + 1.0, np.float32)
            b.all_reduce(x, ReduceOp.SUM, blocking=True).wait(30)
            assert (x == 10).all()
            y = np.full(count, b.backend.rank, np.float32)
            b.broadcast(y, 3, blocking=True).wait(30)
            assert (y == 3).all()
            return b.backend._native.g.tcp.view

        assert run_threads(backends, lambda b: views(b, 512)) == [None] * 4  # 2 KiB: direct
        assert run_threads(backends, lambda b: views(b, 2048)) == [(0, 2)] * 4  # 8 KiB
        with pytest.raises(RuntimeError, match="rank 1 is outside the view"):
            backends[1].backend._native.g.tcp.barrier()
    finally:
        _close(backends)


def test_a_bad_two_level_minimum_is_named(monkeypatch):
    from ndist.collectives.backends.socket.native import _twolevel

    monkeypatch.setenv("NDIST_NATIVE_TWO_LEVEL_MIN", "lots")
    with pytest.raises(ValueError, match=r"NDIST_NATIVE_TWO_LEVEL_MIN: expected a byte count .* got 'lots'"):
        _twolevel.min_bytes()
    monkeypatch.setenv("NDIST_NATIVE_HOSTS", "mod:0")
    with pytest.raises(ValueError, match=r"NDIST_NATIVE_HOSTS: expected a rank count k >= 1 or 'mod:k', got 'mod:0'"):
        _twolevel.host_split((0, 1))


def _cma_ops(b, k: int, big: bool):
    """reduce_scatter, all_to_all (even, and uneven: blocks of 1 to 3 halves of a part) and
    all_gather with parts of ``k`` float32s, and an all_reduce of 2 MiB (``big``: the two-level
    one, whose leaders' parts are 1 MiB) or of ``k`` int64s, at 2 hosts x 2 on one machine
    (every link a Unix socket: every pair may read each other's memory); returns what differs
    from NumPy's answer and the payloads this rank read by address."""
    r, n = b.backend.rank, b.backend.size
    tcp = b.backend._native.g.tcp
    before, bad = tcp.cma_blocks, []
    rs = np.zeros(k, np.float32)
    b.reduce_scatter(rs, [np.arange(k, dtype=np.float32) + r + 10 * j for j in range(n)], ReduceOp.SUM,
                     blocking=True).wait(30)
    if not np.array_equal(rs, n * np.arange(k, dtype=np.float32) + n * (n - 1) / 2 + 10 * n * r):
        bad.append("reduce_scatter")
    a2a = np.zeros(n * k, np.int32)
    b.all_to_all_single(a2a, np.arange(n * k, dtype=np.int32) + 1000 * r, blocking=True).wait(30)
    if not np.array_equal(a2a, np.concatenate([np.arange(r * k, (r + 1) * k, dtype=np.int32) + 1000 * q
                                               for q in range(n)])):
        bad.append("all_to_all")
    send = [k * (1 + (p + r) % 3) // 2 for p in range(n)]  # to rank p: 1, 2 or 3 halves of k float64s
    recv = [k * (1 + (r + q) % 3) // 2 for q in range(n)]
    out = np.zeros(sum(recv), np.float64)
    b.all_to_all_single(out, np.full(sum(send), r, np.float64), out_splits=recv, in_splits=send,
                        blocking=True).wait(30)
    if not np.array_equal(out, np.repeat(np.arange(n, dtype=np.float64), recv)):
        bad.append("all_to_all uneven")
    ag = np.zeros(n * k, np.int16)
    b.all_gather_into(ag, np.full(k, r, np.int16), blocking=True).wait(30)
    if not np.array_equal(ag, np.repeat(np.arange(n, dtype=np.int16), k)):
        bad.append("all_gather")
    ar = np.full(1 << 18 if big else k, r + 1, np.int64)  # 2 MiB (the leaders' two phases), or k
    b.all_reduce(ar, ReduceOp.SUM, blocking=True).wait(30)
    if not (ar == n * (n + 1) // 2).all():
        bad.append("all_reduce")
    return bad, tcp.cma_blocks - before


@pytest.mark.parametrize("cma_min, below, above", [("", 8192, 131072), ("16384", 512, 8192), ("0", 512, 131072)],
                         ids=["default", "16K", "off"])
def test_parts_for_a_peer_on_this_host_go_by_address_from_the_single_copy_minimum(monkeypatch, cma_min, below,
                                                                                   above):
    """The direct ops' parts (and the leaders' steps, whose leaders share this machine here)
    for a peer that may read this rank's memory go by address from ``NDIST_NATIVE_CMA_MIN``
    bytes, 512 KiB when it is unset (``TCP_CMA_MIN``): each read counts in
    ``TcpGroup.cma_blocks``. Below it (parts of ``below`` float32s: 32 KiB, 2 KiB), or with the
    setting 0, they go through the socket; the results are the same."""
    monkeypatch.setenv("NDIST_NATIVE_HOSTS", "2")
    monkeypatch.setenv("NDIST_NATIVE_CMA_MIN", cma_min)
    backends = _up(4)
    try:
        assert [b.backend._native.g.tcp.cma_min for b in backends] == [int(cma_min or 512 << 10)] * 4
        small = run_threads(backends, lambda b: _cma_ops(b, below, False))
        assert small == [([], 0)] * 4
        large = run_threads(backends, lambda b: _cma_ops(b, above, True))
        assert [bad for bad, _ in large] == [[]] * 4
        # every rank reads 3 reduce_scatter parts, 3 all_to_all blocks and 3 uneven ones (the
        # smallest: half a part, at the minimum); a leader (0, 2) also the other leader's
        # all_gather host block and its all_reduce part in both phases
        want = [9 + (3 if r in (0, 2) else 0) for r in range(4)] if cma_min != "0" else [0] * 4
        assert [blocks for _, blocks in large] == want
    finally:
        _close(backends)
