"""ndist.Tensor through ndist.multiprocessing: moved to shared memory, received without a copy."""

import gc
import os

import numpy as np
import pytest

import ndist.multiprocessing as mp

from tests.runtime.multiprocessing import _mp_workers as w
from tests.sharing import strategy  # noqa: F401 - a fixture

Tensor = getattr(__import__("ndist.tensor", fromlist=["x"]), "Tensor", None)
pytestmark = pytest.mark.skipif(Tensor is None, reason="the tensor layer has not landed in this checkout")

METHODS = [m for m in ("spawn", "fork", "forkserver") if m in mp.get_all_start_methods()]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", METHODS)
def test_tensor_through_queue_moves_to_shared_memory(strategy, method):
    ctx = mp.get_context(method)
    t = Tensor._wrap(np.zeros((2, 3), np.float32))
    assert not t.is_shared()
    q, done = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=w.tensor_from_queue, args=(q, done))
    p.start()
    q.put(t)
    assert done.get(timeout=60) == ("ok", "Tensor", True)
    p.join(60)
    assert p.exitcode == 0
    assert t.is_shared()  # the sender's tensor was moved, as in torch
    np.testing.assert_array_equal(t._data, 1.0)  # the child's in-place change is visible here


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", METHODS)
def test_tensor_as_process_argument(strategy, method):
    ctx = mp.get_context(method)
    t = Tensor._wrap(np.arange(4, dtype=np.int32)).share_memory_()
    done = ctx.Queue()
    p = ctx.Process(target=w.tensor_in_place, args=(t, done))
    p.start()
    assert done.get(timeout=60)[0] == "ok"
    p.join(60)
    assert p.exitcode == 0
    np.testing.assert_array_equal(t._data, np.arange(4) + 1)


@pytest.mark.timeout(120)
def test_share_memory_then_send_costs_no_copy(strategy):
    t = Tensor._wrap(np.arange(8.0)).share_memory_()
    before = t._data
    ptr = t.data_ptr()
    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=w.tensor_from_queue, args=(q, done))
    p.start()
    q.put(t[2:] if hasattr(t, "__getitem__") else t)
    assert done.get(timeout=60)[0] == "ok"
    p.join(60)
    assert t._data is before and t.data_ptr() == ptr  # not moved again
    np.testing.assert_array_equal(t._data[2:], np.arange(2.0, 8.0) + 1)


@pytest.mark.timeout(120)
def test_tensor_from_child_through_pipe(strategy):
    ctx = mp.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe()
    p = ctx.Process(target=w.tensor_to_parent, args=(child_conn, strategy))
    p.start()
    child_conn.close()  # a dead child then shows as EOFError, not a hang
    t = parent_conn.recv()
    assert isinstance(t, Tensor) and t.is_shared()
    np.testing.assert_array_equal(t._data, np.arange(6.0))
    parent_conn.send("got it")
    assert parent_conn.recv() == "changed"
    np.testing.assert_array_equal(t._data, np.arange(6.0) * 10)
    parent_conn.send("bye")
    p.join(60)
    assert p.exitcode == 0
    del t
    gc.collect()
    assert w.shm_names(p.pid) == [] and w.shm_names(os.getpid()) == []


def test_plain_pickle_still_copies():
    import pickle

    t = Tensor._wrap(np.arange(3.0))
    u = pickle.loads(pickle.dumps(t))
    u._data += 1
    np.testing.assert_array_equal(t._data, np.arange(3.0))
    assert not t.is_shared()


@pytest.mark.timeout(120)
def test_tensor_through_pool_tasks_is_shared(strategy):
    t = Tensor._wrap(np.ones(10))
    with mp.get_context("spawn").Pool(2) as pool:
        assert pool.starmap(w.tensor_mark, [(t, i) for i in range(4)], chunksize=1) == [True] * 4
    assert t.is_shared()
    # every task's in-place change landed in the parent's tensor
    np.testing.assert_array_equal(t._data, [-1, -2, -3, -4, 1, 1, 1, 1, 1, 1])


@pytest.mark.timeout(120)
def test_file_system_tensor_outlives_a_sender_that_exited():
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=w.put_tensor_and_exit, args=(q, "file_system"))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    assert len(w.shm_names(p.pid)) == 1  # in flight: kept for the receiver
    t = q.get(timeout=60)
    np.testing.assert_array_equal(t._data, np.arange(5))
    del t
    gc.collect()
    assert w.shm_names(p.pid) == []
