"""Shared arrays through real Queues, Pipes and Process arguments (NumPy level),
for every strategy and start method: no copy, no leak, SIGKILL-safe."""

import gc
import multiprocessing
import os
import signal

import numpy as np
import pytest

import ndist.multiprocessing as mp
from ndist.runtime.multiprocessing._reductions import reduce_array
from ndist.tensor import _shm

from tests.runtime.multiprocessing import _mp_workers as w
from tests.sharing import file_system, strategy  # noqa: F401 - fixtures

METHODS = [m for m in ("spawn", "fork", "forkserver") if m in multiprocessing.get_all_start_methods()]


def _join(p):
    p.join(60)
    assert p.exitcode == 0, f"child exited with {p.exitcode}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", METHODS)
def test_queue_child_writes_are_visible_to_parent(strategy, method):
    ctx = mp.get_context(method)
    arr = _shm.share_array(np.zeros((3, 4)))
    q, done = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=w.add_one_from_queue, args=(q, done))
    p.start()
    q.put(reduce_array(arr[1:]))  # a view: offset and strides travel
    status, pid, total = done.get(timeout=60)
    _join(p)
    assert (status, pid, total) == ("ok", p.pid, 8.0)
    np.testing.assert_array_equal(arr[0], 0.0)
    np.testing.assert_array_equal(arr[1:], 1.0)
    del arr
    gc.collect()
    assert w.shm_names(os.getpid()) == [] and w.shm_names(p.pid) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", METHODS)
def test_process_arguments_share_memory(strategy, method):
    ctx = mp.get_context(method)
    arr = _shm.share_array(np.arange(6, dtype=np.float32)[::-1].copy())
    done = ctx.Queue()
    p = ctx.Process(target=w.add_one_from_handle, args=(reduce_array(arr[::-1]), done))
    p.start()
    assert done.get(timeout=60)[0] == "ok"
    _join(p)
    np.testing.assert_array_equal(arr, np.arange(6, dtype=np.float32)[::-1] + 1)


@pytest.mark.timeout(120)
def test_pipe_from_child_to_parent(strategy):
    ctx = mp.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe()
    p = ctx.Process(target=w.make_and_send, args=(child_conn, strategy, 10))
    p.start()
    child_conn.close()  # a dead child then shows as EOFError, not a hang
    fn, args = parent_conn.recv()
    arr = fn(*args)
    np.testing.assert_array_equal(arr, np.arange(10))
    parent_conn.send("opened")
    assert parent_conn.recv() == "doubled"
    np.testing.assert_array_equal(arr, 2 * np.arange(10))
    parent_conn.send("bye")
    _join(p)
    np.testing.assert_array_equal(arr, 2 * np.arange(10))  # still mapped after the creator exited
    if strategy == "file_system":
        assert len(w.shm_names(p.pid)) == 1  # this process is its last holder
    del arr
    gc.collect()
    assert w.shm_names(p.pid) == []


@pytest.mark.timeout(120)
def test_round_trip_maps_the_same_memory_once(strategy):
    ctx = mp.get_context("spawn")
    arr = _shm.share_array(np.arange(5.0))
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=w.echo_back, args=(q_in, q_out))
    p.start()
    q_in.put(reduce_array(arr))
    fn, args = q_out.get(timeout=60)
    back = fn(*args)
    q_in.put("bye")
    _join(p)
    assert _shm.segment_of(back)[0] is _shm.segment_of(arr)[0]  # cached, not mapped twice
    assert back.__array_interface__["data"][0] == arr[1:].__array_interface__["data"][0]


@pytest.mark.timeout(60)
def test_reduce_array_rejects_private_arrays():
    with pytest.raises(ValueError, match="arr must be in shared memory"):
        reduce_array(np.zeros(3))


@pytest.mark.timeout(120)
def test_numpy_arrays_keep_copy_semantics():
    ctx = mp.get_context("spawn")
    arr = np.zeros(4)
    done = ctx.Queue()
    p = ctx.Process(target=w.add_one_in_place, args=(arr, done))
    p.start()
    assert done.get(timeout=60) == ("ok", 4.0)
    _join(p)
    np.testing.assert_array_equal(arr, 0.0)
    assert not _shm.is_shared(arr)


@pytest.mark.timeout(120)
def test_receiver_killed_with_sigkill_leaks_nothing(file_system):
    ctx = mp.get_context("spawn")
    arr = _shm.share_array(np.full(64, 7.0))
    q, ready = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=w.map_then_wait, args=(q, ready))
    p.start()
    q.put(reduce_array(arr))
    assert ready.get(timeout=60) == 7
    os.kill(p.pid, signal.SIGKILL)
    p.join(60)
    assert p.exitcode == -signal.SIGKILL
    assert len(w.shm_names(os.getpid())) == 1
    del arr
    gc.collect()
    assert w.shm_names(os.getpid()) == []


@pytest.mark.timeout(120)
def test_creator_killed_with_sigkill_is_reclaimed_by_spawn(tmp_path):
    with pytest.raises(mp.ProcessExitedException) as info:
        mp.spawn(w.create_segment_then_die, args=(str(tmp_path),), nprocs=1)
    assert info.value.signal_name == "SIGKILL"
    pid = int((tmp_path / "pid").read_text())
    assert info.value.pid == pid
    assert w.shm_names(pid) == []


_PARENT = """
import os, signal, sys
import ndist.multiprocessing as mp
from tests.runtime.multiprocessing import _mp_workers as w

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    p = ctx.Process(target=w.create_then_wait, args=("file_system", ready))
    p.start()
    pid = ready.get(timeout=60)
    print(pid, flush=True)
    assert len(w.shm_names(pid)) == 1
    os.kill(pid, signal.SIGKILL)
    p.join(60)
    assert len(w.shm_names(pid)) == 1  # left for the parent's exit
"""


@pytest.mark.timeout(120)
def test_parent_reclaims_segments_of_a_killed_child_at_exit(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "parent.py"
    script.write_text(_PARENT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr
    child = int(out.stdout.split()[0])
    assert w.shm_names(child) == []


@pytest.mark.timeout(180)
def test_sender_may_drop_its_reference_before_receivers_open(strategy):
    # file_system: the in-flight count keeps the name; file_descriptor: resource_sharer's dup.
    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Queue()
    arr = _shm.share_array(np.arange(100.0))
    for _ in range(4):
        q.put(reduce_array(arr))
    del arr
    gc.collect()
    procs = [ctx.Process(target=w.check_sum_from_queue, args=(q, done, 4950.0)) for _ in range(4)]
    for p in procs:
        p.start()
    assert [done.get(timeout=120) for _ in procs] == [True] * 4
    for p in procs:
        _join(p)
    assert w.shm_names(os.getpid()) == []


@pytest.mark.timeout(180)
def test_concurrent_holders_open_and_drop_without_losing_or_leaking_the_segment(file_system):
    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Queue()
    arr = _shm.share_array(np.arange(50.0))
    nprocs, rounds = 3, 15
    for _ in range(nprocs * rounds):
        q.put(reduce_array(arr))
    procs = [ctx.Process(target=w.open_drop_repeatedly, args=(q, done, rounds, 1225.0)) for _ in range(nprocs)]
    for p in procs:
        p.start()
    del arr  # the creator lets go while the others race
    gc.collect()
    assert [done.get(timeout=120) for _ in procs] == [rounds] * nprocs
    for p in procs:
        _join(p)
    assert w.shm_names(os.getpid()) == []
