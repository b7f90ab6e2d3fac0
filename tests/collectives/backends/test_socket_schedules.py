"""The socket backend's scheduled algorithms (groups of more than four ranks, or
``NDIST_ALGO=sched``) on real processes: every op, both transports, the choice
of algorithm, and float results bit-identical on every rank."""

from __future__ import annotations

import glob

import numpy as np
import pytest

from ndist.testing import run_ranks
from tests.collectives.backends._socket_bodies import record_schedules
from tests.kill_sync import run_with_victim, step_until_a_peer_dies

pytestmark = pytest.mark.timeout(240)

#: the schedules are the Python engine's (the native engine runs its slot algorithms on one
#: host, docs/native.md): the tests that check which schedule ran pin it
_PY = {"NDIST_ENGINE": "python"}


def _backend():
    import ndist.collectives  # noqa: F401  registers the socket backend
    from ndist.runtime import init_process_group, resolve_group

    from tests.backend_driver import Driver

    init_process_group(backend="socket")
    return Driver(resolve_group(None).backend_for("cpu"))


def _all_ops(rank, world_size, count):
    from ndist.runtime import destroy_process_group

    from tests.collectives.backends._socket_bodies import all_ops

    seen = record_schedules()
    b = _backend()
    try:
        return all_ops(b, count) and (b._prefix, sorted(set(seen)))
    finally:
        destroy_process_group()


@pytest.mark.parametrize("transport,n", [("auto", 5), ("shm", 5), ("tcp", 8), ("auto", 8)])
def test_every_op_scheduled(transport, n):
    res = run_ranks(_all_ops, n, args=(70_000,), transport=None if transport == "auto" else transport,
                    init=False, timeout=200, env=_PY)
    big = "ring" if n & (n - 1) else "rabenseifner"
    # (70,000 float32 is above the recursive-doubling size)
    assert res[0][1] == sorted({big, "binomial", "bruck", "pairwise", "ring" if n & (n - 1) else "recursive_halving",
                                "dissemination"})
    assert not any(glob.glob(f"/dev/shm/{p}*") for p, _ in res)


def test_forced_schedules_on_three_ranks_small_counts():
    res = run_ranks(_all_ops, 3, args=(1,), init=False, timeout=200, env=dict(_PY, NDIST_ALGO="sched"))
    assert "recursive_doubling" in res[0][1] and "ring" in res[0][1]


def test_forced_direct_on_five_ranks_runs_no_schedule():
    res = run_ranks(_all_ops, 5, args=(1,), init=False, timeout=200, env=dict(_PY, NDIST_ALGO="direct"))
    assert all(seen == [] for _, seen in res)


def _float_sums(rank, world_size):
    import ndist.distributed as dist

    seen = record_schedules()
    out = []
    for count in (1001, 300_001):  # recursive doubling; ring / rabenseifner
        x = np.random.default_rng(rank).standard_normal(count).astype(np.float32)
        dist.all_reduce(x)
        out.append(x.view(np.uint32).copy())
    return out, seen


@pytest.mark.parametrize("n", [5, 8])
def test_float_all_reduce_is_bit_identical_on_every_rank(n):
    res = run_ranks(_float_sums, n, timeout=200, env=_PY)
    for i in range(2):
        assert all((r[0][i] == res[0][0][i]).all() for r in res)
    want = sum(np.random.default_rng(r).standard_normal(1001).astype(np.float64) for r in range(n))
    np.testing.assert_allclose(res[0][0][0].view(np.float32), want, rtol=1e-4, atol=1e-4)
    assert res[0][1] == ["recursive_doubling", "ring" if n == 5 else "rabenseifner"]


def _a2a_algos(rank, world_size):
    import ndist.distributed as dist
    from ndist.collectives.backends.socket.schedules._schedule import A2A_BRUCK_MAX

    seen = record_schedules()
    n, out = world_size, []
    for per in (5, A2A_BRUCK_MAX // 4 + 1):  # int32 elements per block: Bruck's, then above it
        x = np.arange(n * per, dtype=np.int32) + rank * 1_000_000  # block j goes to rank j
        y = np.full_like(x, -1)
        seen.clear()
        dist.all_to_all_single(y, x)
        want = np.concatenate([np.arange(rank * per, (rank + 1) * per, dtype=np.int32) + i * 1_000_000
                               for i in range(n)])
        out.append((bool((y == want).all()), list(seen)))
    # the same even blocks, but as split sizes: no rank can know the others' splits
    x = np.arange(n * 5, dtype=np.int32) + rank * 1_000_000
    y = np.full_like(x, -1)
    seen.clear()
    dist.all_to_all_single(y, x, [5] * n, [5] * n)
    want = np.concatenate([np.arange(rank * 5, rank * 5 + 5, dtype=np.int32) + i * 1_000_000 for i in range(n)])
    out.append((bool((y == want).all()), list(seen)))
    return out


@pytest.mark.parametrize("n", [5, 8])
def test_even_small_all_to_all_single_runs_bruck(n):
    res = run_ranks(_a2a_algos, n, timeout=200, env=_PY)
    for small, large, split in res:
        assert small == (True, ["bruck"]) and large == (True, ["pairwise"]) and split == (True, ["pairwise"])


def test_bad_algo_mode_names_the_variable(monkeypatch):
    from ndist.collectives.backends.socket.engine._algorithms import algo_mode

    monkeypatch.setenv("NDIST_ALGO", "fastest")
    with pytest.raises(ValueError, match="NDIST_ALGO.*'fastest'"):
        algo_mode()
    monkeypatch.setenv("NDIST_ALGO", "SCHED")
    assert algo_mode() == "sched"


def _kill_mid_schedule(rank, size, out, op):
    import signal

    import ndist.distributed as dist

    signal.signal(signal.SIGTERM, lambda *a: None)  # stay alive to report; the launcher SIGKILLs after the grace
    dist.init_process_group("socket")
    x = np.arange(512 * size, dtype=np.float32)
    y = np.empty_like(x)
    step = (lambda: dist.all_reduce(x)) if op == "all_reduce" else (lambda: dist.all_to_all_single(y, x))
    return step_until_a_peer_dies(step, rank, size, 2, 20, out, errors=dist.DistNetworkError)


@pytest.mark.parametrize("op", ["all_reduce", "all_to_all"])
def test_sigkill_mid_schedule_fails_every_survivor_naming_the_rank(tmp_path, op):
    """Rank 2 of 6 dies mid-schedule: every survivor (most wait on other survivors,
    not on rank 2) gets a DistNetworkError naming rank 2, never a hang."""
    out = run_with_victim(_kill_mid_schedule, 6, 2, tmp_path, op, term_timeout=20, timeout=200)
    assert out.launcher_exitcode != 0, out
    for rank in (0, 1, 3, 4, 5):
        rec = out[rank]
        assert rec["peer"] == 2 and "rank 2" in rec["msg"], rec
