"""ndist.testing.run_ranks itself: results, failure propagation, hard-timeout kill."""

import os
import time

import pytest

from ndist.runtime import DistTimeoutError
from ndist.testing import RankFailedError, run_ranks

from tests.runtime import _runtime_store_backend  # noqa: F401,E402  registers the test-only "storetest" backend


@pytest.mark.timeout(60)
def test_returns_values_by_rank_and_runs_closures():
    offset = 100
    out = run_ranks(lambda rank, ws, k: (rank, ws, k + offset, os.getpid()), 3, args=(5,), init=False)
    assert [o[:3] for o in out] == [(0, 3, 105), (1, 3, 105), (2, 3, 105)]
    assert len({o[3] for o in out} | {os.getpid()}) == 4  # three fresh processes


def _raise_on_rank_1(rank, ws):
    if rank == 1:
        raise ValueError("boom from rank one")
    time.sleep(30)  # the others are killed when rank 1 fails
    return rank


@pytest.mark.timeout(60)
def test_first_failure_is_reraised_with_rank_and_child_traceback():
    t0 = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        run_ranks(_raise_on_rank_1, 3, init=False)
    err = info.value
    assert err.rank == 1
    assert "ValueError: boom from rank one" in str(err)
    assert "_raise_on_rank_1" in err.traceback
    assert isinstance(err.exception, ValueError)
    assert time.monotonic() - t0 < 25  # did not wait for the sleeping ranks


@pytest.mark.timeout(60)
def test_rank_that_exits_without_reporting_is_named_with_its_exit_code():
    def die(rank, ws):
        if rank == 0:
            os._exit(7)
        time.sleep(30)

    with pytest.raises(RankFailedError, match="rank 0 failed: exited with code 7") as info:
        run_ranks(die, 2, init=False)
    assert info.value.exitcode == 7


@pytest.mark.timeout(60)
def test_rank_killed_by_a_signal_is_reported_by_signal_name():
    def killed(rank, ws):
        import signal

        os.kill(os.getpid(), signal.SIGKILL)

    with pytest.raises(RankFailedError, match="SIGKILL"):
        run_ranks(killed, 1, init=False)


@pytest.mark.timeout(60)
def test_hard_timeout_kills_every_rank_and_its_children(tmp_path):
    def hang(rank, ws, d):
        import subprocess

        child = subprocess.Popen(["sleep", "600"])
        with open(os.path.join(d, f"pids.{rank}"), "w") as f:
            f.write(f"{os.getpid()} {child.pid}")
        if rank == 0:
            return "done"
        time.sleep(600)

    with pytest.raises(DistTimeoutError, match=r"ranks \[1, 2\] of 3 did not finish") :
        run_ranks(hang, 3, args=(str(tmp_path),), init=False, timeout=5)
    pids = []
    for r in range(3):
        pids += [int(x) for x in (tmp_path / f"pids.{r}").read_text().split()]
    alive = _still_alive(pids, 10)
    assert not alive, f"survivors: {alive}"


def _still_alive(pids, seconds):
    """Those of ``pids`` still alive after up to ``seconds`` of waiting for them to go."""
    deadline = time.monotonic() + seconds
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        time.sleep(0.05)
    return alive


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # (reaped, even mid-read)
        return False


@pytest.mark.timeout(60)
def test_env_reaches_the_ranks_only():
    assert "NDIST_TEST_ONLY_IN_CHILD" not in os.environ
    out = run_ranks(lambda r, ws: os.environ.get("NDIST_TEST_ONLY_IN_CHILD"), 2, init=False,
                    env={"NDIST_TEST_ONLY_IN_CHILD": "yes"})
    assert out == ["yes", "yes"]
    assert "NDIST_TEST_ONLY_IN_CHILD" not in os.environ


def test_argument_checks():
    with pytest.raises(TypeError, match="fn"):
        run_ranks(3, 2)
    with pytest.raises(ValueError, match="world_size"):
        run_ranks(print, 0)
    with pytest.raises(ValueError, match="timeout"):
        run_ranks(print, 1, timeout=0)
    with pytest.raises(TypeError, match="env"):
        run_ranks(print, 1, env={"A": 1})
    with pytest.raises(ValueError, match="transport"):
        run_ranks(print, 1, transport="udp")


def _nothing(rank, ws):
    # a module-level function: unpickling it imports this module, which registers "storetest"
    return None


@pytest.mark.timeout(60)
def test_ndist_debug_turns_on_rank_logging(capfd):
    run_ranks(_nothing, 2, backend="storetest", env={"NDIST_DEBUG": "INFO"})
    err = capfd.readouterr().err
    assert "[rank 1] ndist.runtime" in err and "initialised" in err


PARENT = """
import os, sys, time
from ndist.testing import run_ranks

def fn(rank, ws, d):
    import subprocess
    child = subprocess.Popen(["sleep", "600"])
    open(os.path.join(d, f"pids.{{rank}}"), "w").write(f"{{os.getpid()}} {{child.pid}}")
    time.sleep(600)

run_ranks(fn, 2, args=({d!r},), init=False, timeout=600)
"""


@pytest.mark.timeout(90)
def test_ranks_die_with_a_killed_parent(tmp_path):
    import subprocess
    import sys

    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(d=str(tmp_path))])
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"pids.{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline and parent.poll() is None
            time.sleep(0.05)
        time.sleep(0.2)
        pids = [int(x) for r in range(2) for x in (tmp_path / f"pids.{r}").read_text().split()]
    finally:
        parent.kill()  # SIGKILL: run_ranks gets no chance to clean up
        parent.wait()
    alive = _still_alive(pids, 20)
    assert not alive, f"orphans: {alive}"


def _leave_a_segment(rank, world_size):
    from ndist.runtime import _net, _shmfiles

    name = f"{_shmfiles.job_prefix(_net.job_secret())}-left-by-{rank}"
    if rank == 1:
        with open(os.path.join(_shmfiles.SHM_DIR, name), "wb") as f:
            f.write(b"x")
    return name


@pytest.mark.timeout(60)
def test_shm_left_names_what_the_ranks_left_and_the_files_are_gone():
    """``Results.shm_left``: the job's /dev/shm files found once every rank is gone (run_ranks
    removes them; a test asserts on the list, since the folder is clean by then)."""
    out = run_ranks(_leave_a_segment, 2, timeout=30)
    assert out.shm_left == [out[1]], out.shm_left
    assert not os.path.exists(os.path.join("/dev/shm", out[1]))
    assert run_ranks(_leave_a_segment, 1, timeout=30).shm_left == []
