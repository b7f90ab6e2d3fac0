"""Functions run in child processes by the multiprocessing tests (importable by spawn)."""

import os
import signal
import sys
import time

import numpy as np

SHM_DIR = "/dev/shm"


def shm_names(pid):
    """Our file_system segments created by ``pid``, counted straight from /dev/shm."""
    prefix = f"ndist_mp_{pid}_"
    return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(prefix))


def add_one_from_queue(q, done):
    """Rebuild the array handle from ``q``, add 1 in place, tell the parent."""
    fn, args = q.get(timeout=30)
    arr = fn(*args)
    arr += 1
    done.put(("ok", os.getpid(), float(arr.sum())))


def add_one_from_handle(handle, done):
    fn, args = handle
    arr = fn(*args)
    arr += 1
    done.put(("ok", os.getpid(), float(arr.sum())))


def make_and_send(conn, strategy, n):
    """Create a shared array in the child and send its handle to the parent over a Pipe."""
    from ndist.runtime.multiprocessing._reductions import reduce_array
    from ndist.tensor import _shm

    _shm.set_strategy(strategy)
    arr = _shm.share_array(np.arange(n, dtype=np.int64))
    conn.send(reduce_array(arr))
    # Keep the sender alive until the parent has opened it (file_descriptor needs it).
    assert conn.recv() == "opened"
    arr *= 2  # the parent must see this
    conn.send("doubled")
    assert conn.recv() == "bye"


def echo_back(q_in, q_out):
    """Rebuild a handle and send the same memory back."""
    from ndist.runtime.multiprocessing._reductions import reduce_array

    fn, args = q_in.get(timeout=30)
    arr = fn(*args)
    q_out.put(reduce_array(arr[1:]))
    assert q_in.get(timeout=30) == "bye"


def map_then_wait(q, ready):
    """Map a handle, report ready, then sleep until killed."""
    fn, args = q.get(timeout=30)
    arr = fn(*args)
    ready.put(int(arr[0]))
    time.sleep(600)


def create_then_wait(strategy, ready):
    """Create a file_system segment that nobody else knows about, then wait to be killed."""
    from ndist.tensor import _shm

    _shm.set_strategy(strategy)
    arr = _shm.share_array(np.ones(1024))
    ready.put(os.getpid())
    time.sleep(600)
    return arr


def tensor_add_one(q, done):
    t = q.get(timeout=30)
    t._data += 1
    done.put(("ok", type(t).__name__))


# --- spawn targets: fn(i, *args) ---------------------------------------------

def write_index(i, directory, tag):
    with open(os.path.join(directory, f"{i}"), "w") as fh:
        fh.write(f"{tag}:{os.getpid()}")


def raise_on_one(i, directory):
    if i == 1:
        raise ValueError(f"boom from {i}")
    time.sleep(120)  # must be terminated by the parent


def kill_self_on_zero(i):
    if i == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)


def exit_with(i, code):
    sys.exit(code)


def sleep_for(i, seconds):
    time.sleep(seconds)


def create_segment_then_die(i, directory):
    from ndist.tensor import _shm

    _shm.set_strategy("file_system")
    arr = _shm.share_array(np.zeros(256))
    with open(os.path.join(directory, "pid"), "w") as fh:
        fh.write(str(os.getpid()))
    os.kill(os.getpid(), signal.SIGKILL)
    return arr


def add_one_in_place(arr, done):
    arr += 1
    done.put(("ok", float(arr.sum())))


def tensor_in_place(t, done):
    """Receive a Tensor as a Process argument and change it in place."""
    t._data += 1
    done.put(("ok", type(t).__name__, bool(t.is_shared())))


def tensor_from_queue(q, done):
    t = q.get(timeout=30)
    t._data += 1
    done.put(("ok", type(t).__name__, bool(t.is_shared())))


def tensor_to_parent(conn, strategy):
    import ndist
    import ndist.multiprocessing as mp

    mp.set_sharing_strategy(strategy)
    t = ndist.Tensor._wrap(np.arange(6.0))
    conn.send(t)  # moves t to shared memory
    assert conn.recv() == "got it"
    t._data *= 10
    conn.send("changed")
    assert conn.recv() == "bye"


def check_sum_from_queue(q, done, expected):
    """Open a handle whose sender may already have dropped its own reference."""
    fn, args = q.get(timeout=60)
    try:
        arr = fn(*args)
    except Exception as e:  # report instead of letting the parent wait
        done.put(repr(e))
        return
    done.put(float(arr.sum()) == expected)


def tensor_mark(t, i):
    """Pool task: write a distinct element of a shared tensor in place."""
    t._data[i] = -(i + 1)
    return bool(t.is_shared())


def put_tensor_and_exit(q, strategy):
    """Send a tensor and exit at once: the receiver opens it after this process is gone."""
    import ndist
    import ndist.multiprocessing as mp

    mp.set_sharing_strategy(strategy)
    q.put(ndist.Tensor._wrap(np.arange(5, dtype=np.int16)))


def open_drop_repeatedly(q, done, n, expected):
    """Open and drop many in-flight handles of one segment, racing the other holders."""
    import gc

    ok = 0
    for _ in range(n):
        fn, args = q.get(timeout=60)
        try:
            arr = fn(*args)
            ok += float(arr.sum()) == expected
            del arr
            gc.collect()
        except Exception as e:
            done.put(repr(e))
            return
    done.put(ok)
