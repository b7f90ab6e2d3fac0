"""spawn / start_processes / ProcessContext with torch.multiprocessing.spawn semantics."""

import os
import pickle
import sys
import signal
import time

import pytest

import ndist.multiprocessing as mp

from tests.runtime.multiprocessing import _mp_workers as w


@pytest.mark.timeout(120)
def test_spawn_calls_fn_with_index_and_args(tmp_path):
    assert mp.spawn(w.write_index, args=(str(tmp_path), "hello"), nprocs=3) is None
    files = sorted(os.listdir(tmp_path))
    assert files == ["0", "1", "2"]
    pids = {(tmp_path / f).read_text().split(":")[1] for f in files}
    assert len(pids) == 3 and str(os.getpid()) not in pids
    assert all((tmp_path / f).read_text().startswith("hello:") for f in files)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["clean", "raised", "killed"])
def test_the_error_files_folder_goes_once_join_returns_true_or_raises(tmp_path, how):
    """start_processes's private folder of error files is removed when join has seen every
    process end, not later with the context (which a caller or a traceback may keep)."""
    fn, args, exc = {"clean": (w.sleep_for, (0.1,), None),
                     "raised": (w.raise_on_one, (str(tmp_path),), mp.ProcessRaisedException),
                     "killed": (w.kill_self_on_zero, (), mp.ProcessExitedException)}[how]
    ctx = mp.start_processes(fn, args=args, nprocs=2, join=False)
    folder = os.path.dirname(ctx.error_files[0])
    assert os.path.basename(folder).startswith("ndist-spawn-") and os.path.isdir(folder)
    deadline = time.monotonic() + 60
    if exc is None:
        while not ctx.join(timeout=1):
            assert time.monotonic() < deadline
    else:
        with pytest.raises(exc):
            while not ctx.join(timeout=1, grace_period=5):
                assert time.monotonic() < deadline
    assert not os.path.exists(folder)


@pytest.mark.timeout(120)
def test_join_false_returns_a_process_context():
    ctx = mp.spawn(w.sleep_for, args=(0.5,), nprocs=2, join=False)
    assert isinstance(ctx, mp.ProcessContext)
    assert len(ctx.processes) == 2
    assert ctx.pids() == [p.pid for p in ctx.processes] and all(isinstance(p, int) for p in ctx.pids())
    assert ctx.join(timeout=0) is False  # still sleeping
    deadline = time.monotonic() + 60
    while not ctx.join(timeout=1):
        assert time.monotonic() < deadline
    assert ctx.join() is True  # idempotent once done
    assert all(p.exitcode == 0 for p in ctx.processes)


@pytest.mark.timeout(120)
def test_child_exception_becomes_process_raised_exception_and_others_are_terminated(tmp_path):
    ctx = mp.start_processes(w.raise_on_one, args=(str(tmp_path),), nprocs=3, join=False)
    with pytest.raises(mp.ProcessRaisedException) as info:
        while not ctx.join():
            pass
    err = info.value
    assert isinstance(err, mp.ProcessException)
    assert err.error_index == 1 and err.pid == ctx.pids()[1]
    assert "-- Process 1 terminated with the following error:" in str(err)
    assert "Traceback (most recent call last)" in str(err)
    assert "ValueError: boom from 1" in str(err)
    assert "raise_on_one" in str(err)  # the child's frame is in the message
    assert not any(p.is_alive() for p in ctx.processes)
    assert ctx.processes[0].exitcode == -signal.SIGTERM


@pytest.mark.timeout(120)
def test_child_killed_by_signal_becomes_process_exited_exception():
    with pytest.raises(mp.ProcessExitedException, match="process 0 terminated with signal SIGKILL") as info:
        mp.spawn(w.kill_self_on_zero, nprocs=2)
    err = info.value
    assert err.error_index == 0 and err.exit_code == -signal.SIGKILL and err.signal_name == "SIGKILL"
    assert isinstance(err.pid, int)


@pytest.mark.timeout(120)
def test_nonzero_exit_code_becomes_process_exited_exception():
    with pytest.raises(mp.ProcessExitedException, match="process 0 terminated with exit code 3") as info:
        mp.spawn(w.exit_with, args=(3,), nprocs=1)
    assert info.value.exit_code == 3 and info.value.signal_name is None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", [m for m in ("fork", "forkserver") if m in mp.get_all_start_methods()])
def test_start_processes_with_other_start_methods(tmp_path, method):
    mp.start_processes(w.write_index, args=(str(tmp_path), method), nprocs=2, start_method=method)
    assert sorted(os.listdir(tmp_path)) == ["0", "1"]


@pytest.mark.timeout(120)
def test_spawn_with_another_start_method_warns_and_uses_spawn(tmp_path):
    with pytest.warns(FutureWarning, match="only supports start_method=spawn"):
        mp.spawn(w.write_index, args=(str(tmp_path), "x"), nprocs=1, start_method="fork")
    assert os.listdir(tmp_path) == ["0"]


def test_bad_arguments_raise_before_starting_anything():
    with pytest.raises(ValueError, match=r"nprocs must be a positive int, got 0"):
        mp.start_processes(w.sleep_for, nprocs=0)
    with pytest.raises(ValueError, match=r"start_method must be one of .*'threads'"):
        mp.start_processes(w.sleep_for, start_method="threads")
    with pytest.raises(TypeError, match="fn must be callable, got int"):
        mp.start_processes(3)
    with pytest.raises(TypeError, match="args must be a tuple, got list"):
        mp.start_processes(w.sleep_for, args=[1])


def test_exceptions_pickle_round_trip():
    raised = pickle.loads(pickle.dumps(mp.ProcessRaisedException("msg", 2, 1234)))
    assert (type(raised), str(raised), raised.error_index, raised.pid) == (mp.ProcessRaisedException, "msg", 2, 1234)
    exited = pickle.loads(pickle.dumps(mp.ProcessExitedException("m", 1, 99, -9, "SIGKILL")))
    assert (exited.error_index, exited.pid, exited.exit_code, exited.signal_name) == (1, 99, -9, "SIGKILL")


@pytest.mark.timeout(120)
def test_error_files_live_in_a_private_directory_removed_with_the_context():
    import gc

    ctx = mp.start_processes(w.sleep_for, args=(0,), nprocs=2, join=False)
    directory = os.path.dirname(ctx.error_files[0])
    assert {os.path.dirname(f) for f in ctx.error_files} == {directory}
    assert os.stat(directory).st_mode & 0o777 == 0o700
    while not ctx.join():
        pass
    del ctx
    gc.collect()
    assert not os.path.exists(directory)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/status") as fh:
            return "\nState:\tZ" not in fh.read()
    except (FileNotFoundError, ProcessLookupError):  # (reaped, even mid-read)
        return False


_ORPHANING_PARENT = """
import os, signal, sys
import ndist.multiprocessing as mp
from tests.runtime.multiprocessing import _mp_workers as w

if __name__ == "__main__":
    ctx = mp.spawn(w.sleep_for, args=(300,), nprocs=1, join=False)
    print(ctx.pids()[0], flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.timeout(120)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_children_die_with_their_parent(tmp_path):
    import subprocess

    script = tmp_path / "parent.py"
    script.write_text(_ORPHANING_PARENT)
    # (the SIGKILLed parent cannot remove its error files' folder: TMPDIR is the test's)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=100,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.returncode == -signal.SIGKILL
    child = int(proc.stdout.split()[0])
    deadline = time.monotonic() + 60
    while _alive(child):
        assert time.monotonic() < deadline, "the orphaned child kept running"
        time.sleep(0.05)


def test_spawn_context_is_the_deprecated_name_of_process_context():
    with pytest.warns(DeprecationWarning, match="renamed to ProcessContext"):
        ctx = mp.SpawnContext([], [])
    assert isinstance(ctx, mp.ProcessContext) and ctx.join() is True


@pytest.mark.timeout(120)
def test_unpicklable_fn_raises_in_the_parent_and_leaves_nothing_running():
    import multiprocessing as stdlib_mp

    before = set(stdlib_mp.active_children())
    with pytest.raises((AttributeError, TypeError, pickle.PicklingError)):
        mp.spawn(lambda i: None, nprocs=2)
    assert set(stdlib_mp.active_children()) <= before
