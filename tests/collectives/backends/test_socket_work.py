"""SocketWork: Work semantics with the Future made only on demand."""

from __future__ import annotations

import threading

import pytest

from ndist.collectives.backends.socket._work import SocketWork
from ndist.runtime import DistBackendError, DistTimeoutError

pytestmark = pytest.mark.timeout(30)


def test_completed_work_needs_no_future():
    w = SocketWork("all_reduce", 3, ["x"])
    assert not w.is_completed() and w.exception() is None
    w._complete()
    w._fail(RuntimeError("late"))  # completion happens once
    assert w._fut is None
    assert w.wait() and w.wait(5) and w.is_completed() and w.is_success() and w.exception() is None
    assert w.result() == ["x"] and w._fut is None
    with pytest.raises(TypeError, match="timeout"):
        w.wait("soon")
    fut = w.get_future()  # made on demand, already resolved like the work
    assert fut.done() and fut.result() == ["x"] and w.get_future() is fut
    assert repr(w) == "<Work all_reduce #3 ok>"


def test_failed_work_raises_and_its_future_carries_the_error():
    w = SocketWork("barrier", 1)
    err = DistBackendError("rank 1 failed")
    w._fail(err)
    w._complete()
    with pytest.raises(DistBackendError, match="rank 1 failed"):
        w.wait()
    assert w.exception() is err and not w.is_success()
    assert w.get_future().exception() is err


def test_future_taken_before_completion_resolves_and_waiters_wake():
    w = SocketWork("all_gather", 2, [1])
    fut = w.get_future()
    chained = w.then(lambda: None)
    got = []
    t = threading.Thread(target=lambda: got.append(w.wait(10)))
    t.start()
    w._complete()
    t.join(10)
    assert got == [True] and fut.result() == [1] and chained.wait(5)


def test_pending_wait_times_out_with_the_description():
    w = SocketWork("all_reduce", 7, pending=lambda: "ranks not heard from: [1]")
    with pytest.raises(DistTimeoutError, match=r"all_reduce \(#7\).*ranks not heard from: \[1\]"):
        w.wait(0.05)
