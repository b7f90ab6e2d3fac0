"""CUDA tensors through ndist.multiprocessing (CUDA IPC). Skips without CuPy or a GPU."""

import numpy as np
import pytest

import ndist.multiprocessing as mp


def _gpu_count():
    from tests.gpu._gpu import gpu_count  # fails the run on a GPU that cannot be used

    return gpu_count()


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_gpu_count() == 0, reason="needs CuPy and a CUDA GPU")]


def _answer(done, proc, timeout=60.0):
    """The child's answer on ``done``; fails at once, with its exit code, when the child died
    before answering (its traceback is on stderr), instead of waiting out ``timeout``."""
    import queue
    import time

    deadline = time.monotonic() + timeout
    while True:
        try:
            return done.get(timeout=0.5)
        except queue.Empty:
            if not proc.is_alive():
                pytest.fail(f"the child exited with {proc.exitcode} before answering (its traceback: stderr)")
            if time.monotonic() > deadline:
                proc.kill()
                proc.join(10)
                pytest.fail(f"the child did not answer within {timeout} s")


@pytest.mark.timeout(180)
def test_cuda_array_through_queue_is_shared_not_copied():
    import cupy

    from tests.gpu import _mp_cuda_workers as w
    from ndist.runtime.multiprocessing._cuda import reduce_cuda_array

    base = cupy.arange(1000, dtype=cupy.float32)
    view = base[10:510]  # a chunk of a pooled allocation, at an offset
    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=w.add_one_cuda, args=(q, done))
    p.start()
    q.put(reduce_cuda_array(view))
    status, first, shape = _answer(done, p)
    assert (status, first, tuple(shape)) == ("ok", 10.0, (500,))
    expected = np.arange(1000, dtype=np.float32)
    expected[10:510] += 1
    np.testing.assert_array_equal(cupy.asnumpy(base), expected)  # the producer sees the child's writes
    q.put("bye")
    p.join(60)
    assert p.exitcode == 0


def test_cuda_handle_rebuilt_in_the_producer_is_its_own_memory():
    import cupy

    from ndist.runtime.multiprocessing._cuda import reduce_cuda_array

    x = cupy.arange(64, dtype=cupy.int32)[8:]
    fn, args = reduce_cuda_array(x)
    y = fn(*args)
    assert y.data.ptr == x.data.ptr and y.shape == x.shape
    y[0] = -1
    assert int(x[0]) == -1


@pytest.mark.timeout(60)
def test_a_cuda_array_reduces_on_a_thread_that_made_no_cuda_call():
    """A Queue pickles on its feeder thread, where no CUDA context is current yet (the driver
    call that finds the allocation failed there: CUDA_ERROR_INVALID_CONTEXT)."""
    import threading

    import cupy

    from ndist.runtime.multiprocessing._cuda import reduce_cuda_array

    a = cupy.arange(8, dtype=cupy.float32)
    out = {}

    def target():
        try:
            out["reduced"] = reduce_cuda_array(a)
        except BaseException as e:  # noqa: BLE001
            out["error"] = e

    t = threading.Thread(target=target)
    t.start()
    t.join(30)
    assert "error" not in out, out.get("error")
    fn, args = out["reduced"]
    b = fn(*args)  # in this process: the producer's own memory
    assert int(b.data.ptr) == int(a.data.ptr)
    np.testing.assert_array_equal(cupy.asnumpy(b), np.arange(8, dtype=np.float32))


@pytest.mark.timeout(180)
def test_cuda_tensor_through_queue():
    import cupy

    from tests.gpu import _mp_cuda_workers as w
    from ndist.tensor import zeros

    t = zeros(16, device="cuda")
    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=w.add_one_tensor, args=(q, done))
    p.start()
    q.put(t)  # the producer keeps t alive while the consumer uses it
    status, device = _answer(done, p)
    assert status == "ok" and device.startswith("cuda")
    np.testing.assert_array_equal(cupy.asnumpy(t._data), 1.0)
    q.put("bye")
    p.join(60)
    assert p.exitcode == 0
