"""monitored_barrier: rank 0 names the ranks that did not arrive, at the timeout,
and no rank hangs (issue #15: rank 0 never returned, the timeout was ignored)."""

import os
import time

import pytest

from ndist.testing import run_ranks

TIMEOUT = 2.0


def _stay_until_reported(flags, present, most):
    """An absent rank stays alive (its exit would be a loss, not an absence) until every
    present rank has its outcome, or ``most`` seconds."""
    deadline = time.monotonic() + most
    while time.monotonic() < deadline and not all(os.path.exists(os.path.join(flags, str(r))) for r in present):
        time.sleep(0.01)


def _reported(flags, rank, outcome):
    open(os.path.join(flags, str(rank)), "w").close()
    return outcome


def _absent(rank, ws, absent, wait_all, flags):
    from datetime import timedelta

    import ndist.distributed as dist

    t0 = time.monotonic()
    if rank in absent:  # alive, but never calls monitored_barrier
        _stay_until_reported(flags, set(range(ws)) - absent, 3 * TIMEOUT + 2)
        return ("absent", None, time.monotonic() - t0)
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=TIMEOUT), wait_all_ranks=wait_all)
        return _reported(flags, rank, ("passed", None, time.monotonic() - t0))
    except dist.DistTimeoutError as err:
        return _reported(flags, rank, ("raised", str(err), time.monotonic() - t0))


@pytest.mark.timeout(120)
def test_rank0_names_the_first_missing_rank_at_the_timeout_and_no_rank_hangs(tmp_path):
    out = run_ranks(_absent, 4, args=({1, 3}, False, str(tmp_path)), timeout=60)
    state, msg, took = out[0]
    assert state == "raised", out[0]
    assert "Rank 1 failed to pass monitoredBarrier" in msg and "3" not in msg.split("in ")[0], msg
    assert TIMEOUT * 0.9 <= took < TIMEOUT + 5, took
    state, msg, took = out[2]
    assert state == "raised" and took < 2 * TIMEOUT + 5, out[2]
    assert "rank 0 reports: Rank 1 failed to pass monitoredBarrier" in msg, msg  # at once, the same report


@pytest.mark.timeout(120)
def test_wait_all_ranks_names_every_missing_rank(tmp_path):
    out = run_ranks(_absent, 4, args=({1, 3}, True, str(tmp_path)), timeout=60)
    state, msg, took = out[0]
    assert state == "raised", out[0]
    assert "Ranks 1, 3 failed to pass monitoredBarrier" in msg, msg
    assert took < TIMEOUT + 5, took


@pytest.mark.timeout(120)
def test_only_rank0_calls_with_wait_all_ranks(tmp_path):
    # torch's docstring: rank 0 alone -> "ranks 1, 2, ... world_size - 1 did not call"
    out = run_ranks(_absent, 3, args=({1, 2}, True, str(tmp_path)), timeout=60)
    assert out[0][0] == "raised" and "Ranks 1, 2 failed" in out[0][1], out[0]


def _all_call(rank, ws):
    import ndist.distributed as dist

    for _ in range(3):
        assert dist.monitored_barrier(timeout=30) is None
    sub = dist.new_group([1, 2])
    if rank in (1, 2):
        assert dist.monitored_barrier(group=sub, timeout=30, wait_all_ranks=True) is None
    return True


@pytest.mark.timeout(120)
def test_everyone_arrives_repeatedly_and_on_a_subgroup():
    assert run_ranks(_all_call, 3, timeout=90) == [True] * 3


def _late(rank, ws):
    """Rank 1 arrives after rank 0 gave up: it raises rank 0's report at once."""
    import ndist.distributed as dist

    if rank == 1:
        time.sleep(TIMEOUT + 1.5)
    t0 = time.monotonic()
    try:
        dist.monitored_barrier(timeout=TIMEOUT)
        return ("passed", time.monotonic() - t0)
    except dist.DistTimeoutError as err:
        return (str(err), time.monotonic() - t0)


@pytest.mark.timeout(120)
def test_a_late_rank_raises_instead_of_hanging():
    out = run_ranks(_late, 2, timeout=60)
    assert "Rank 1 failed" in out[0][0], out
    assert "rank 0 reports: Rank 1 failed" in out[1][0] and out[1][1] < TIMEOUT, out


def _rank0_absent(rank, ws, flags):
    import ndist.distributed as dist

    if rank == 0:
        _stay_until_reported(flags, set(range(1, ws)), 3 * TIMEOUT + 2)
        return None
    t0 = time.monotonic()
    try:
        dist.monitored_barrier(timeout=TIMEOUT)
        return _reported(flags, rank, ("passed", time.monotonic() - t0))
    except dist.DistTimeoutError as err:
        return _reported(flags, rank, (str(err), time.monotonic() - t0))


@pytest.mark.timeout(120)
def test_without_rank0_the_others_raise_after_twice_the_timeout(tmp_path):
    out = run_ranks(_rank0_absent, 3, args=(str(tmp_path),), timeout=60)
    for r in (1, 2):
        msg, took = out[r]
        assert f"rank {r} was not released by rank 0" in msg, msg
        assert 2 * TIMEOUT * 0.9 <= took < 2 * TIMEOUT + 5, took


def test_bad_arguments():
    def fn(rank, ws):
        import ndist.distributed as dist

        errs = []
        for kwargs in ({"timeout": "5"}, {"timeout": -1}, {"wait_all_ranks": 1}):
            try:
                dist.monitored_barrier(**kwargs)
            except (TypeError, ValueError) as err:
                errs.append(type(err).__name__ + ": " + str(err).split(":")[0])
        dist.monitored_barrier(timeout=30)  # still usable
        return errs

    out = run_ranks(fn, 2, timeout=60)
    assert out[0] == ["TypeError: timeout", "ValueError: timeout", "TypeError: wait_all_ranks"], out
