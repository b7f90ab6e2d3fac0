"""Issue-order execution: inline on the caller's thread when idle, else one worker.

A blocking call (the caller waits right away) on an idle executor runs on the
caller's thread: no thread hop. Anything else is queued to one worker thread
per executor, which runs jobs strictly in submission order; a blocking call
behind queued work is queued too, so order holds.

The executor also numbers its owner's operations (``number``, ``claim``: the sequence
number every rank's frames and records carry), under the same lock as its queue, so
the numbers follow the order the operations run in.

Its busy flag, its last sequence number, its queue's length, its closed flag and the number of
threads waiting in ``drain`` live in a ``state`` object:
the native engine's ``_cnative.LaneState`` (C11 atomics, so that the repeated call in C,
``_cnative.FastLane`` and the C interface, takes the same flag and number without this lock
and without the GIL: docs/architecture.md, "One call, by hand"; native/clane.c's comment says
why the order holds), or ``PyState`` where nothing was compiled. Every claim of the flag is one
test-and-set (``state.claim()``), made after checking the queue is empty and the executor
open; the worker claims it before it pops a job, so a claim that sees the queue empty never
races a job just popped. ``state.queued`` is stored under the lock after each append and pop
(C reads it for the queue's length), and every number is one ``state.next()``.

``state.closed`` is the one "closed" of the executor and of its owner: ``close`` sets it, and so
does ``SocketBackend.close`` first of all, so that every claim (Python's and C's) refuses from
then on; nothing keeps a copy. ``state.drainers`` counts the threads waiting in ``drain``
(changed under the lock): whoever clears the busy flag without the worker's end (``leave``,
``run_inline``, ``submit``'s inline branch, and C's end of a call, ``native/clane.c``'s
``leave``) wakes the condition when a job is queued or a thread drains, so ``drain`` waits for
a notification, never a tick, and a call with nobody draining pays one read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from ....runtime import DistBackendError, Work

__all__ = ["Executor"]

log = logging.getLogger("ndist.collectives.socket")


class PyState:
    """The executor's busy flag, sequence number, closed flag and drainer count in Python
    (``_cnative.LaneState``'s twin, where nothing was compiled): claimed and numbered only
    under the executor's lock. ``queued`` and ``broken`` are facts LaneState holds for C,
    kept here alike (nothing reads them)."""

    __slots__ = ("busy", "seq", "queued", "closed", "broken", "drainers")

    def __init__(self) -> None:
        self.busy = False
        self.seq = 0
        self.queued = 0
        self.closed = False
        self.broken = False
        self.drainers = 0

    def next(self) -> int:
        """The next sequence number."""
        self.seq += 1
        return self.seq

    def claim(self) -> bool:
        """Take the flag: True, or False when it is taken."""
        if self.busy:
            return False
        self.busy = True
        return True

    def clear(self) -> None:
        self.busy = False


def _run(work: Work, job) -> None:
    try:
        job()
    except BaseException as err:  # noqa: BLE001 - delivered through the Work
        work.fail(err)
    else:
        work.complete()


class Executor:
    def __init__(self, name: str, state=None) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queue: deque = deque()
        #: the busy flag, the last sequence number and the closed flag (``LaneState`` or ``PyState``)
        self.state = PyState() if state is None else state
        self._thread: threading.Thread | None = None
        self.current: Work | None = None

    @property
    def seq(self) -> int:
        """The number of the last operation numbered (``number`` / ``claim``)."""
        return self.state.seq

    @property
    def closed(self) -> bool:
        """Closed (``close``, or the owner's ``state.closed = True``): nothing is claimed or run any more."""
        return self.state.closed

    def number(self) -> int:
        """The next operation's sequence number (an operation that will be queued or run
        with ``run_inline``)."""
        with self._lock:
            return self.state.next()

    def claim(self) -> int:
        """The thin lane's entry (``SocketBackend._inline``): when nothing runs or is queued,
        mark this executor busy, number the operation and return its number; the caller
        then runs it on its own thread and ends it with ``leave``. 0: the operation must
        go through ``submit`` instead (numbering nothing)."""
        with self._lock:
            st = self.state
            if self._queue or st.closed or not st.claim():
                return 0
            return st.next()

    def idle(self) -> bool:
        """Nothing runs or is queued (a snapshot, without the lock)."""
        return not self.state.busy and not self._queue

    def wake(self) -> None:
        """Wake the worker (a job is queued and the flag was just cleared, by the C
        repeated call's end)."""
        with self._lock:
            self._cond.notify_all()

    def run_inline(self, job) -> bool:
        """Run ``job`` on this thread now if nothing is running or queued; False if
        it must be queued instead. ``job``'s exception propagates to the caller."""
        st = self.state
        with self._lock:  # the condition's lock, without Condition's Python-level __enter__
            if self._queue or st.closed or not st.claim():
                return False
        try:
            job()
        finally:
            with self._lock:
                st.clear()
                if self._queue or st.drainers:
                    self._cond.notify_all()
        return True

    def leave(self) -> None:
        """End a job run on the caller's thread after the owner marked this executor busy
        under its lock (``claim``: the socket backend's thin lane, ``SocketBackend._inline``).

        Unlike ``run_inline``'s end, the flag is cleared without the lock (atomic under
        the GIL, and in C), and the lock is taken only to wake the worker when a job is
        queued or a thread waits in ``drain``: a thread that queued one (or counted itself
        in ``state.drainers``) did so under the lock after seeing the flag set, so before
        this store, and the check that follows the store sees it; a thread that sees the
        flag clear runs or queues as on an idle executor (or returns from ``drain``). (The
        C core, ``native/clane.c``'s ``leave``, ends its calls the same way, without the
        GIL: it reads ``state.queued`` and ``state.drainers`` and calls ``wake``.)"""
        st = self.state
        st.clear()
        if self._queue or st.drainers:
            with self._lock:
                self._cond.notify_all()

    def submit(self, work: Work, job, blocking: bool) -> Work:
        st = self.state
        with self._cond:
            if st.closed:
                work.fail(DistBackendError(f"{self.name}: backend is closed"))
                return work
            inline = blocking and not self._queue and st.claim()
            if inline:
                self.current = work
            else:
                self._queue.append((work, job))
                st.queued = len(self._queue)  # (C's claim reads it: native/clane.c)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, name=f"ndist-{self.name}", daemon=True)
                    self._thread.start()
                self._cond.notify_all()
        if inline:
            try:
                _run(work, job)
            finally:
                with self._cond:
                    st.clear()
                    self.current = None
                    if self._queue or st.drainers:
                        self._cond.notify_all()
        return work

    def _loop(self) -> None:
        st = self.state
        while True:
            with self._cond:
                # the flag first, then the job: a claim that sees the queue empty never
                # races a job popped here but not yet marked
                while not st.closed and not (self._queue and st.claim()):
                    self._cond.wait()
                if st.closed:
                    return
                work, job = self._queue.popleft()
                st.queued = len(self._queue)
                self.current = work
            try:
                _run(work, job)
            finally:
                with self._cond:
                    st.clear()
                    self.current = None
                    self._cond.notify_all()

    def ahead(self, work: Work) -> int | None:
        """How many operations run or wait before ``work`` (None: it is not queued)."""
        with self._lock:
            for i, (queued, _) in enumerate(self._queue):
                if queued is work:
                    return i + (1 if self.state.busy else 0)
        return None

    def drain(self, deadline: float) -> bool:
        """Wait until every queued job has run and the flag is clear (or ``deadline``, a
        ``time.monotonic()`` value, passed, or the executor closed); True when idle. Counted in
        ``state.drainers`` while it waits, so whoever clears the flag wakes it (``leave``)."""
        st = self.state
        with self._cond:
            if not (st.busy or self._queue):
                return True
            st.drainers += 1
            try:
                while st.busy or self._queue:
                    if st.closed:
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(left)
                return not (st.busy or self._queue)
            finally:
                st.drainers -= 1

    def close(self, reason: str) -> None:
        with self._cond:
            self.state.closed = True
            queued = list(self._queue)
            self._queue.clear()
            self.state.queued = 0
            self._cond.notify_all()
        for work, _ in queued:
            work.fail(DistBackendError(f"{self.name}: {reason}"))
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=2.0)
