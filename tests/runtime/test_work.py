import threading
import time
from concurrent.futures import Future

import pytest

from ndist.runtime import DistNetworkError, DistTimeoutError, HashStore, Work


def test_completed_work_reports_success_and_outputs():
    w = Work.completed("all_reduce", 3, outputs=["t"])
    assert w.is_completed() and w.is_success()
    assert w.wait() is True
    assert w.exception() is None
    assert w.result() == ["t"]
    assert isinstance(w.get_future(), Future)


def test_failed_work_reraises_typed_error_on_wait():
    err = DistNetworkError("peer 2 lost", rank=2, host="h")
    w = Work.failed("all_to_all", err, seq=7)
    assert w.is_completed() and not w.is_success()
    assert w.exception() is err
    with pytest.raises(DistNetworkError) as info:
        w.wait()
    assert info.value.rank == 2


def test_wait_timeout_names_op_seq_and_pending():
    w = Work("all_gather", 17, pending=lambda: "ranks not heard from: [1, 3]")
    with pytest.raises(DistTimeoutError, match=r"all_gather \(#17\).*ranks not heard from: \[1, 3\]"):
        w.wait(timeout=0.05)
    assert isinstance(DistTimeoutError("x"), TimeoutError)


def test_completion_from_another_thread_wakes_waiter():
    w = Work("barrier", 0)
    threading.Timer(0.05, w.complete).start()
    assert w.wait(timeout=5)


def test_then_runs_after_completion_and_propagates_errors():
    ran = []
    w = Work("gather", 1)
    chained = w.then(lambda: ran.append(1))
    assert not chained.is_completed()
    w.complete()
    assert chained.wait(1) and ran == [1]

    w2 = Work("gather", 2)
    c2 = w2.then(lambda: 1 / 0)
    w2.complete()
    with pytest.raises(ZeroDivisionError):
        c2.wait(1)


def test_wait_rejects_bad_timeout_type():
    with pytest.raises(TypeError, match="timeout"):
        Work.completed("x").wait(timeout="soon")


def test_hash_store_semantics():
    s = HashStore(timeout=1)
    s.set("a", "1")
    assert s.get("a") == b"1"
    assert s.add("n", 2) == 2 and s.add("n", 3) == 5
    assert s.compare_set("c", "", "x") == b"x"
    assert s.compare_set("c", "y", "z") == b"x"
    assert s.check(["a", "n"]) and not s.check(["a", "zz"])
    s.append("ap", b"ab"); s.append("ap", b"cd")
    assert s.get("ap") == b"abcd"
    assert s.delete_key("a") and not s.delete_key("a")
    t0 = time.monotonic()
    with pytest.raises(DistTimeoutError, match=r"missing keys: \['never'\]"):
        s.wait(["n", "never"], timeout=0.1)
    assert time.monotonic() - t0 < 2


def test_then_carries_outputs_known_only_at_completion():
    w = Work("recv", 4)
    chained = w.then(lambda: None)
    w.outputs = [3]  # a backend learns recv's source when the message arrives
    w.complete()
    assert chained.result() == [3]


# ---------------------------------------------------------------- the lazy Future
def test_completed_work_makes_no_future_until_asked():
    w = Work("all_reduce", 3, ["x"])
    assert not w.is_completed() and w.exception() is None
    w.complete()
    w.fail(RuntimeError("late"))  # completion happens once
    assert w._fut is None
    assert w.wait() and w.wait(5) and w.is_completed() and w.is_success() and w.exception() is None
    assert w.result() == ["x"] and w._fut is None
    with pytest.raises(TypeError, match="timeout"):
        w.wait("soon")
    fut = w.get_future()  # made on demand, already resolved like the work
    assert fut.done() and fut.result() == ["x"] and w.get_future() is fut
    assert repr(w) == "<Work all_reduce #3 ok>"


def test_failed_work_raises_and_its_future_carries_the_error():
    w = Work("barrier", 1)
    err = DistNetworkError("rank 1 lost", rank=1)
    w.fail(err)
    w.complete()
    with pytest.raises(DistNetworkError, match="rank 1 lost"):
        w.wait()
    assert w.exception() is err and not w.is_success()
    assert w.get_future().exception() is err


def test_future_taken_before_completion_resolves_and_waiters_wake():
    w = Work("all_gather", 2, [1])
    fut = w.get_future()
    chained = w.then(lambda: None)
    seen = []
    w.add_done_callback(lambda done: seen.append(done.outputs))
    got = []
    t = threading.Thread(target=lambda: got.append(w.wait(10)))
    t.start()
    w.complete()
    t.join(10)
    assert got == [True] and fut.result() == [1] and chained.wait(5) and seen == [[1]]


def test_on_timeout_hook_sees_the_error_before_it_is_raised():
    w = Work("all_reduce", 7, pending=lambda: "ranks not heard from: [1]")
    hooked = []
    w.on_timeout = hooked.append
    with pytest.raises(DistTimeoutError) as info:
        w.wait(0.05)
    assert hooked == [info.value]
