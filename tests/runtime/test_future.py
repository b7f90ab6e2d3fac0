"""ndist.futures.Future: torch.futures' API on a concurrent.futures.Future,
and Work.get_future() returning one."""

import concurrent.futures
import threading
import time

import numpy as np
import pytest

import ndist
import ndist.futures as futures
from ndist.futures import Future, collect_all, wait_all
from ndist.testing import run_ranks


def test_is_a_stdlib_future_with_torchs_methods():
    fut = Future()
    assert isinstance(fut, concurrent.futures.Future)
    assert not fut.done()
    with pytest.raises(RuntimeError, match="not completed"):
        fut.value()
    fut.set_result(5)
    assert fut.done() and fut.wait() == 5 and fut.value() == 5 and fut.result() == 5
    assert fut.exception() is None
    assert futures.__all__ == ["Future", "collect_all", "wait_all"]
    assert Future(devices=["cpu"]).devices == ["cpu"]


def test_set_exception_raises_from_wait_value_and_result():
    fut = Future()
    fut.set_exception(ValueError("foo"))  # torch's docstring example
    for get in (fut.wait, fut.value, fut.result):
        with pytest.raises(ValueError, match="foo"):
            get()
    assert isinstance(fut.exception(), ValueError)
    with pytest.raises(TypeError, match="result: expected an exception"):
        Future().set_exception("not an exception")


def test_then_chains_values_like_torchs_docstring():
    seen = []
    fut = Future()
    cb_fut = fut.then(lambda f: seen.append(f"RPC return value is {f.wait()}."))
    chain = cb_fut.then(lambda x: seen.append(f"Chained cb done. {x.wait()}"))
    doubled = fut.then(lambda f: f.value() * 2)
    fut.set_result(5)
    assert seen == ["RPC return value is 5.", "Chained cb done. None"]
    assert doubled.wait() == 10 and chain.wait() is None
    # a completed future runs the callback inline
    assert fut.then(lambda f: f.value() + 1).value() == 6
    with pytest.raises(TypeError, match="callback"):
        fut.then(5)


def test_then_propagates_the_error_of_the_parent_and_of_the_callback():
    fut = Future()
    child = fut.then(lambda f: f.wait() + 1)
    grandchild = child.then(lambda f: f.value())
    fut.set_exception(KeyError("k"))
    with pytest.raises(KeyError):
        child.wait()
    with pytest.raises(KeyError):
        grandchild.wait()
    ok = Future()
    bad = ok.then(lambda f: 1 / 0)
    ok.set_result(1)
    with pytest.raises(ZeroDivisionError):
        bad.wait()


def test_add_done_callback_gets_the_future():
    got = []
    fut = Future()
    fut.add_done_callback(lambda f: got.append(f.wait()))
    threading.Timer(0.05, fut.set_result, args=(7,)).start()
    assert fut.wait() == 7
    for _ in range(100):
        if got:
            break
        threading.Event().wait(0.01)
    assert got == [7]


def test_collect_all_and_wait_all():
    fut0, fut1 = Future(), Future()
    fut = collect_all([fut0, fut1])
    fut0.set_result(0)
    assert not fut.done()
    fut1.set_result(1)
    fut_list = fut.wait()
    assert fut_list == [fut0, fut1] and [f.wait() for f in fut_list] == [0, 1]
    assert wait_all([fut0, fut1]) == [0, 1]
    assert collect_all([]).wait() == []
    bad, pending = Future(), Future()
    combined = collect_all([pending, bad])
    bad.set_exception(RuntimeError("rank 1 lost"))
    with pytest.raises(RuntimeError, match="rank 1 lost"):
        combined.wait()
    with pytest.raises(RuntimeError, match="rank 1 lost"):
        wait_all([bad])
    with pytest.raises(TypeError, match=r"futures\[1\]"):
        collect_all([fut0, 3])


def test_lazy_import():
    import subprocess
    import sys

    code = "import ndist, sys; assert 'ndist.futures' not in sys.modules; ndist.futures.Future; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def _work_futures(rank, ws):
    import ndist.distributed as dist

    t = ndist.tensor([rank + 1.0, 10.0])
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    doubled = fut.then(lambda f: (f.value()[0] * 2).tolist()).wait()
    out = dict(type=type(fut).__name__, module=type(fut).__module__, is_future=isinstance(fut, Future), doubled=doubled,
               value=[x.tolist() for x in fut.wait()])
    # isend / irecv: torch raises there; ndist's work and future do complete
    buf = np.zeros(2)
    if rank == 0:
        w = dist.isend(np.array([3.0, 4.0]), dst=1)
        w.get_future().wait()
    else:
        w = dist.irecv(buf, src=0)
        out["recv_src"] = w.get_future().then(lambda f: f.value()).wait()
        out["recv"] = buf.tolist()
    return out


@pytest.mark.timeout(120)
def test_work_get_future_is_an_ndist_future_with_then():
    out = run_ranks(_work_futures, 2, timeout=90)
    for o in out:
        assert o["module"] == "ndist.runtime._future" and o["type"] == "WorkFuture" and o["is_future"]
        assert o["doubled"] == [6.0, 40.0] and o["value"] == [[3.0, 20.0]]
    assert out[1]["recv_src"] == [0] and out[1]["recv"] == [3.0, 4.0]


def test_work_callbacks_run_off_the_completing_thread_and_hooks_on_it():
    from ndist.runtime import Work

    work = Work("all_reduce", 3, outputs=[1])
    ran = {}
    got = threading.Event()

    def callback(name):
        def cb(_):
            ran[name] = threading.current_thread().name
            if len(ran) == 3:
                got.set()
        return cb

    work.get_future().add_done_callback(callback("future"))
    work.get_future().then(callback("then"))
    work.add_done_hook(callback("hook"))
    t = threading.Thread(target=work.complete, name="progress")
    t.start()
    t.join(10)
    assert got.wait(10), ran
    assert ran["hook"] == "progress"
    assert ran["future"] == ran["then"] == "ndist-callbacks"
    # registered once complete: at once, on the registering thread
    late = []
    work.get_future().add_done_callback(lambda _: late.append(threading.current_thread().name))
    work.add_done_hook(lambda _: late.append(threading.current_thread().name))
    assert late == [threading.current_thread().name] * 2


def test_a_callback_thread_for_every_blocked_callback():
    """Callbacks that block until a later one ran: each needs its own thread."""
    from ndist.runtime import Work

    works = [Work("op") for _ in range(4)]
    released = [threading.Event() for _ in works]
    order = []

    def cb(i):
        def run(_):
            order.append(i)
            if i + 1 < len(works):
                works[i + 1].complete()  # from a callback thread: its callbacks need another one
                assert released[i + 1].wait(10)
            released[i].set()
        return run

    for i, w in enumerate(works):
        w.get_future().add_done_callback(cb(i))
    works[0].complete()
    assert released[0].wait(20), order
    assert order == [0, 1, 2, 3]


def _nested_then(rank, ws):
    """PowerSGD's shape: each callback starts a collective and waits on it, three deep,
    and the third waits on a chain whose own callback does the same."""
    import threading as th

    import ndist.distributed as dist

    names = set()

    def cb1(fut):
        names.add(th.current_thread().name)
        x = fut.value()[0] * 2  # [2 * sum]
        return dist.all_reduce(x, async_op=True).get_future().wait()[0]

    def cb2(fut):
        names.add(th.current_thread().name)
        x = fut.value() + rank
        dist.all_reduce(x)  # blocking, inside a callback
        w = dist.all_reduce(x.copy(), async_op=True)
        w.wait()
        return w.result()[0]

    def cb3(fut):
        names.add(th.current_thread().name)
        x = fut.value() + 1

        def inner(f):
            names.add(th.current_thread().name)
            y = f.value()[0] * 10
            return dist.all_reduce(y, async_op=True).get_future().wait()[0]

        return dist.all_reduce(x, async_op=True).get_future().then(inner).wait()

    done = []
    a = np.array([rank + 1.0])
    w = dist.all_reduce(a, async_op=True)
    w.add_done_callback(lambda work: done.append(dist.all_reduce(np.ones(1), async_op=True).get_future().wait()))
    result = w.get_future().then(cb1).then(cb2).then(cb3).wait()
    deadline = time.monotonic() + 30
    while not done and time.monotonic() < deadline:
        time.sleep(0.01)
    return result.tolist(), [d[0].tolist() for d in done], sorted(names)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [2, 3])
def test_then_callbacks_start_collectives_and_wait_three_deep(world_size):
    out = run_ranks(_nested_then, world_size, timeout=60)
    s = sum(range(1, world_size + 1))
    x1 = world_size * 2 * s  # cb1
    x2 = world_size * sum(x1 + r for r in range(world_size))  # cb2: all_reduce in place, then again
    x3 = world_size * (x2 + 1)  # cb3
    final = world_size * x3 * 10  # cb3's inner callback
    for result, done, names in out:
        assert result == [final]
        assert done == [[float(world_size)]]
        # never on the thread that progresses collectives (the socket backend's "ndist-<group>")
        assert set(names) <= {"ndist-callbacks", "MainThread"}, names
