"""The nccl backend's CudaWork + Watchdog logic, driven by host-side events.

The watchdog only needs events with ``done`` / ``synchronize()``; here they are
threading.Events, so completion, timeouts (abort + fail every pending work)
and asynchronous NCCL errors are checked without a GPU. The CUDA side is
covered by the GPU tests beside this file.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time

import pytest

from ndist.collectives.backends.nccl._work import CudaWork, Watchdog, settle_at_close, unfinished
from ndist.runtime import DistBackendError, DistTimeoutError

pytestmark = pytest.mark.timeout(60)


class HostEvent:
    def __init__(self) -> None:
        self._set = threading.Event()

    @property
    def done(self) -> bool:
        return self._set.is_set()

    def fire(self) -> None:
        self._set.set()

    def synchronize(self) -> None:
        self._set.wait()


class Comm:
    """What the backend's check/abort callbacks see."""

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.aborted: list[BaseException] = []

    def check(self):
        return self.error

    def abort(self, exc):
        self.aborted.append(exc)


@pytest.fixture
def comm():
    return Comm()


@pytest.fixture
def dog(comm):
    wd = Watchdog("group 'g' rank 0", contextlib.nullcontext, comm.check, comm.abort, poll_s=0.001)
    yield wd
    wd.stop()


def _work(comm, op="all_reduce", seq=1, outputs=None):
    ev = HostEvent()
    return CudaWork(op, seq, ev, comm.check, outputs), ev


def test_work_completes_when_its_event_fires(comm, dog):
    w, ev = _work(comm, outputs=["t"])
    dog.add(w, timeout_s=30)
    assert not w.is_completed()
    ev.fire()
    assert w.get_future().result(timeout=10) == ["t"]
    assert w.is_success() and w.exception() is None
    assert dog.pending() == []


def test_is_completed_polls_the_event_without_the_watchdog(comm):
    w, ev = _work(comm)
    assert not w.is_completed()
    ev.fire()
    assert w.is_completed() and w.is_success()


def test_later_works_complete_after_earlier_ones(comm, dog):
    (w1, e1), (w2, e2) = _work(comm, seq=1), _work(comm, seq=2)
    dog.add(w1, 30)
    dog.add(w2, 30)
    e2.fire()
    e1.fire()
    w1.get_future().result(timeout=10)
    w2.get_future().result(timeout=10)
    assert [w.is_success() for w in (w1, w2)] == [True, True]


def test_timeout_aborts_and_fails_every_pending_work(comm, dog):
    (w1, _), (w2, _) = _work(comm, "all_gather", 7), _work(comm, "broadcast", 8)
    dog.add(w1, timeout_s=0.05)
    dog.add(w2, timeout_s=30)
    with pytest.raises(DistTimeoutError, match=r"all_gather \(#7\).*group 'g' rank 0.*aborted"):
        w1.wait(timeout=30)
    with pytest.raises(DistTimeoutError):
        w2.wait(timeout=30)
    assert len(comm.aborted) == 1 and isinstance(comm.aborted[0], DistTimeoutError)


def test_async_error_fails_pending_works(comm, dog):
    w, _ = _work(comm)
    dog.add(w, timeout_s=30)
    comm.error = DistBackendError("nccl: asynchronous error on rank 0: peer 1 died")
    with pytest.raises(DistBackendError, match="peer 1 died"):
        w.wait(timeout=30)
    assert comm.aborted == [comm.error]


def test_event_done_but_comm_failed_is_a_failure(comm):
    w, ev = _work(comm)
    comm.error = DistBackendError("remote error")
    ev.fire()
    assert w.is_completed() and not w.is_success()
    assert isinstance(w.exception(), DistBackendError)


def test_synchronize_waits_for_the_event_and_raises_its_error(comm):
    w, ev = _work(comm)
    threading.Thread(target=ev.fire).start()
    w.synchronize()
    assert w.is_success()
    w2, ev2 = _work(comm)
    comm.error = DistBackendError("boom")
    ev2.fire()
    with pytest.raises(DistBackendError, match="boom"):
        w2.synchronize()


def test_wait_without_timeout_reraises_a_known_failure(comm):
    w, _ = _work(comm)
    w.fail(DistBackendError("aborted"))
    with pytest.raises(DistBackendError, match="aborted"):
        w.wait()


def test_stopped_watchdog_refuses_work(comm, dog):
    dog.stop()
    w, _ = _work(comm)
    with pytest.raises(RuntimeError, match="stopped"):
        dog.add(w, 30)


def test_future_made_before_or_after_completion_resolves(comm):
    early, ev1 = _work(comm, outputs=["a"])
    fut = early.get_future()
    assert not fut.done()
    ev1.fire()
    assert early.is_completed()
    assert fut.result(timeout=5) == ["a"]

    late, ev2 = _work(comm, outputs=["b"])
    ev2.fire()
    assert late.is_completed()
    assert late.get_future().result(timeout=5) == ["b"]

    failed, _ = _work(comm)
    failed.fail(DistBackendError("x"))
    assert isinstance(failed.get_future().exception(timeout=5), DistBackendError)
    failed.complete()  # completes once: the failure stays
    assert not failed.is_success()


def test_wait_with_timeout_blocks_until_done(comm, dog):
    w, ev = _work(comm, outputs=["t"])
    dog.add(w, 30)
    threading.Timer(0.05, ev.fire).start()
    assert w.wait(timeout=30) is True
    assert w.is_success()
    with pytest.raises(DistTimeoutError, match=r"all_reduce \(#3\)"):
        _work(comm, seq=3)[0].wait(timeout=0.01)


# ------------------------------------------------------------------ close()
# NcclBackend.close() takes the watchdog's pending works plus the works of an open
# coalescing block; the latter have no event until the block's groupEnd.

def _unlaunched(comm, op="send", seq=1):
    return CudaWork(op, seq, None, comm.check, None)


def test_a_work_without_event_counts_as_unfinished(comm):
    done, ev = _work(comm)
    ev.fire()
    assert unfinished([done]) is False
    assert unfinished([done, _unlaunched(comm)]) is True  # no AttributeError on the missing event
    failed = _unlaunched(comm)
    failed.fail(DistBackendError("x"))
    assert unfinished([failed]) is False


def test_close_fails_works_of_an_open_block_and_their_deferred_steps(comm):
    send, recv = _unlaunched(comm, "send", 1), _unlaunched(comm, "recv", 2)
    ran = []
    chained = recv.then(lambda: ran.append(1))  # deferred to the block's end
    exc = DistBackendError("nccl: the backend of group 'g' was closed")
    settle_at_close([send, recv], unfinished([send, recv]), exc)
    for w in (send, recv, chained):
        with pytest.raises(DistBackendError, match="closed"):
            w.wait()
    assert ran == []  # the write-back of an op that never ran is not run


def test_close_after_a_clean_finish_completes_and_busy_close_fails(comm, dog):
    (ok, e1), (stuck, _) = _work(comm, seq=1), _work(comm, seq=2)
    e1.fire()
    settle_at_close([ok], unfinished([ok]), DistBackendError("closed"))
    assert ok.is_success()
    settle_at_close([stuck], unfinished([stuck]), DistBackendError("closed"))
    assert isinstance(stuck.exception(), DistBackendError)


# ------------------------------------------------------ a call that blocks the host
# NCCL >= 2.22 connects to peers inside the first call that needs them, so a missing peer
# blocks the enqueue itself, before any Work exists. The backend arms the group timeout
# before the call (enter_call / leave_call); here the call is a plain callable that blocks
# until the abort releases it (as ncclCommAbort releases a call stuck connecting).

def test_a_call_blocked_on_the_host_is_aborted_at_the_deadline(comm):
    released = threading.Event()
    aborted = []

    def on_fatal(exc):
        aborted.append(exc)
        released.set()

    dog = Watchdog("group 'g' rank 0", contextlib.nullcontext, comm.check, on_fatal, poll_s=0.001)
    queued, _ = _work(comm, "broadcast", 4)
    dog.add(queued, timeout_s=60)  # an earlier op, still running
    try:
        t0 = time.monotonic()
        dog.enter_call("all_reduce", 5, timeout_s=0.3)
        try:
            assert released.wait(30), "the deadline never fired: the call would block forever"
        finally:
            dog.leave_call()
        assert 0.25 <= time.monotonic() - t0 < 20
        assert len(aborted) == 1 and isinstance(aborted[0], DistTimeoutError)
        assert re.search(r"all_reduce \(#5\).*group 'g' rank 0.*blocked.*aborted", str(aborted[0]))
        with pytest.raises(DistTimeoutError, match=r"all_reduce \(#5\)"):
            queued.wait(timeout=30)  # every pending Work fails with it
    finally:
        dog.stop()


def test_a_call_that_returns_in_time_is_not_aborted(comm, dog):
    for seq in range(50):
        dog.enter_call("all_reduce", seq, timeout_s=0.2)
        dog.leave_call()
    time.sleep(0.5)  # past every deadline armed above
    w, ev = _work(comm)
    dog.add(w, 30)
    ev.fire()
    assert w.wait(timeout=30) is True
    assert comm.aborted == []


class CountingEvent(HostEvent):
    """A host event that counts how often the watchdog asked whether it fired."""

    def __init__(self) -> None:
        super().__init__()
        self.queries = 0

    @property
    def done(self) -> bool:
        self.queries += 1
        return self._set.is_set()


def test_works_on_one_stream_complete_with_the_newest_event_queried_only(comm):
    # Events on one stream fire in order: once the newest fired, the older ones need no query.
    stream, other = object(), object()
    evs = [CountingEvent() for _ in range(6)]
    works = [CudaWork("all_reduce", i, ev, comm.check) for i, ev in enumerate(evs)]
    for ev in evs:
        ev.fire()
    wd = Watchdog("group 'g' rank 0", contextlib.nullcontext, comm.check, comm.abort, poll_s=0.001)
    try:
        for w in works[:5]:
            wd.add(w, timeout_s=30, stream=stream)
        wd.add(works[5], timeout_s=30, stream=other)  # the newest is on another stream: no shortcut
        for w in works:
            w.get_future().result(timeout=10)
        assert all(ev.queries >= 1 for ev in evs)  # each one had to be asked
    finally:
        wd.stop()
    evs = [CountingEvent() for _ in range(6)]
    works = [CudaWork("all_reduce", i, ev, comm.check) for i, ev in enumerate(evs)]
    for ev in evs:
        ev.fire()
    queued = threading.Event()

    @contextlib.contextmanager
    def device():  # entered by the watchdog's thread before its loop: holds it until all six are queued
        queued.wait(10)
        yield

    wd = Watchdog("group 'g' rank 0", device, comm.check, comm.abort, poll_s=0.001)
    try:
        for w in works:
            wd.add(w, timeout_s=30, stream=stream)
        queued.set()
        for w in works:
            w.get_future().result(timeout=10)
        assert [ev.queries for ev in evs[:5]] == [0] * 5 and evs[5].queries == 1
    finally:
        wd.stop()


# ------------------------------------------------------ the thin enqueue (issue 46)
# Events come from a pool and go back once the watchdog saw them fire; an operation nobody
# keeps a Work of (async_op=False) is watched by its event alone; the watchdog takes its lock
# once per round, not once per operation.

from ndist.collectives.backends.nccl._events import EventPool  # noqa: E402


class ReusableEvent(HostEvent):
    """A host event that can be recorded again (as a CUDA event is, once it fired)."""

    def record(self) -> None:
        self._set.clear()


def test_event_pool_reuses_what_was_released_and_keeps_at_most_keep():
    pool = EventPool(ReusableEvent, keep=2)
    a, b, c = pool.acquire(), pool.acquire(), pool.acquire()
    assert pool.made == 3 and len({id(a), id(b), id(c)}) == 3
    for ev in (a, b, c):
        pool.release(ev)
    assert len(pool) == 2  # the third is dropped
    assert {id(pool.acquire()), id(pool.acquire())} == {id(a), id(b)}
    assert pool.made == 3
    pool.acquire()
    assert pool.made == 4
    with pytest.raises(ValueError, match=r"keep: expected a count >= 0, got -1"):
        EventPool(ReusableEvent, keep=-1)


def test_events_of_completed_works_go_back_to_the_pool_and_the_works_stay_completed(comm, dog):
    pool = EventPool(ReusableEvent)
    works = []
    for seq in range(5):
        ev = pool.acquire()
        w = CudaWork("all_reduce", seq, ev, comm.check, ["t"])
        dog.add(w, 30, pool=pool)
        works.append((w, ev))
    for w, ev in works:
        ev.fire()
    for w, _ in works:
        assert w.get_future().result(timeout=10) == ["t"]
    deadline = time.monotonic() + 10
    while len(pool) < 5 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert len(pool) == 5 and pool.made == 5
    # the next operations take the same events and record them again: the finished works
    # never look at them again
    again = [pool.acquire() for _ in range(5)]
    assert pool.made == 5
    for ev in again:
        ev.record()
    for w, _ in works:
        assert w.is_completed() and w.is_success() and w.wait() is True and w.exception() is None


def test_events_of_failed_works_are_not_pooled(comm, dog):
    pool = EventPool(ReusableEvent)
    w = CudaWork("broadcast", 3, pool.acquire(), comm.check)
    dog.add(w, timeout_s=0.05, pool=pool)
    with pytest.raises(DistTimeoutError, match=r"broadcast \(#3\)"):
        w.wait(timeout=30)
    assert len(pool) == 0  # its kernel may still run: the event is not recorded again


def test_an_operation_without_work_is_watched_by_its_event(comm, dog):
    import gc
    import weakref

    class Temp:  # what the GPU still reads: kept until the event fired
        pass

    pool = EventPool(ReusableEvent)
    ev, temp = pool.acquire(), Temp()
    ref = weakref.ref(temp)
    dog.add_event("all_reduce", 9, ev, 30, keepalive=temp, pool=pool)
    del temp
    gc.collect()
    assert ref() is not None and dog.busy() and dog.pending() == []  # no Work to report
    ev.fire()
    deadline = time.monotonic() + 10
    while (len(pool) < 1 or ref() is not None) and time.monotonic() < deadline:
        time.sleep(0.005)
        gc.collect()
    assert len(pool) == 1 and ref() is None and not dog.busy()


def test_an_operation_without_work_that_hangs_aborts_and_fails_the_pending_works(comm, dog):
    queued, _ = _work(comm, "broadcast", 4)
    dog.add_event("all_reduce", 3, ReusableEvent(), timeout_s=0.05)
    dog.add(queued, timeout_s=60)
    with pytest.raises(DistTimeoutError, match=r"nccl all_reduce \(#3\) on group 'g' rank 0 did not complete"):
        queued.wait(timeout=30)
    assert len(comm.aborted) == 1 and "all_reduce (#3)" in str(comm.aborted[0])


class CountingCondition(threading.Condition):
    """The watchdog's condition, counting who takes its lock."""

    def __init__(self) -> None:
        super().__init__()
        self.by_thread: dict[str, int] = {}

    def __enter__(self):
        name = threading.current_thread().name
        self.by_thread[name] = self.by_thread.get(name, 0) + 1
        return super().__enter__()


def test_the_watchdog_takes_its_lock_once_per_round_and_feeding_it_takes_none(comm):
    queued = threading.Event()

    @contextlib.contextmanager
    def device():  # holds the watchdog's thread until every entry is queued
        queued.wait(10)
        yield

    wd = Watchdog("group 'g' rank 0", device, comm.check, comm.abort, poll_s=0.001)
    cond = wd._cond = CountingCondition()
    stream = object()
    try:
        works = []
        for seq in range(8):
            w, ev = _work(comm, seq=seq)
            ev.fire()
            works.append(w)
        wd.add(works[0], 30, stream=stream)  # starts the thread (held in device())
        me = threading.current_thread().name
        before = cond.by_thread.get(me, 0)
        for w in works[1:]:
            wd.add(w, 30, stream=stream)
            fired = ReusableEvent()
            fired.fire()
            wd.add_event("all_reduce", 99, fired, 30, stream=stream)
        assert cond.by_thread.get(me, 0) == before  # the issuing thread took no lock
        queued.set()
        for w in works:
            w.get_future().result(timeout=10)
        dog_thread = wd._thread.name
        assert wd.rounds >= 1
        # all 15 entries had fired: one round took them, under one lock
        assert cond.by_thread.get(dog_thread, 0) == 1, cond.by_thread
    finally:
        wd.stop()


class RefusingEvent(HostEvent):
    """An event whose first queries raise, as CUDA refuses a query while another thread
    captures a graph in mode global."""

    def __init__(self, refusals: int) -> None:
        super().__init__()
        self.refusals = refusals

    @property
    def done(self) -> bool:
        if self.refusals > 0:
            self.refusals -= 1
            raise RuntimeError("cudaErrorStreamCaptureUnsupported: operation not permitted when stream is capturing")
        return self._set.is_set()


def test_a_refused_event_query_counts_as_not_fired_and_the_watchdog_lives_on(comm, dog):
    ev = RefusingEvent(refusals=5)
    ev.fire()
    w = CudaWork("all_reduce", 1, ev, comm.check)
    dog.add(w, 30)
    assert w.wait(timeout=30) is True and ev.refusals == 0
    w2, ev2 = _work(comm, seq=2)  # the thread still watches
    dog.add(w2, 30)
    ev2.fire()
    assert w2.wait(timeout=30) is True
    stuck = CudaWork("broadcast", 3, RefusingEvent(refusals=10 ** 9), comm.check)
    dog.add(stuck, timeout_s=0.1)  # refused forever: the group timeout still holds
    with pytest.raises(DistTimeoutError, match=r"broadcast \(#3\)"):
        stuck.wait(timeout=30)
