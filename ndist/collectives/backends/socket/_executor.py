"""Issue-order execution: inline on the caller's thread when idle, else one worker.

A blocking call (the caller waits right away) on an idle executor runs on the
caller's thread: no thread hop. Anything else is queued to one worker thread
per executor, which runs jobs strictly in submission order; a blocking call
behind queued work is queued too, so order holds.

The executor also numbers its owner's operations (``number``, ``claim``: the sequence
number every rank's frames and records carry), under the same lock as its queue, so
the numbers follow the order the operations run in.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from ....runtime import DistBackendError, Work

__all__ = ["Executor"]

log = logging.getLogger("ndist.collectives.socket")


def _run(work: Work, job) -> None:
    try:
        job()
    except BaseException as err:  # noqa: BLE001 - delivered through the Work
        work.fail(err)
    else:
        work.complete()


class Executor:
    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queue: deque = deque()
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self.current: Work | None = None
        #: the number of the last operation numbered (``number`` / ``claim``)
        self.seq = 0

    def number(self) -> int:
        """The next operation's sequence number (an operation that will be queued or run
        with ``run_inline``)."""
        with self._lock:
            self.seq = seq = self.seq + 1
        return seq

    def claim(self) -> int:
        """The thin lane's entry (``SocketBackend._inline``): when nothing runs or is queued,
        mark this executor busy, number the operation and return its number; the caller
        then runs it on its own thread and ends it with ``leave``. 0: the operation must
        go through ``submit`` instead (numbering nothing)."""
        with self._lock:
            if self._busy or self._queue or self._closed:
                return 0
            self._busy = True
            self.seq = seq = self.seq + 1
        return seq

    def idle(self) -> bool:
        """Nothing runs or is queued (a snapshot, without the lock)."""
        return not self._busy and not self._queue

    def run_inline(self, job) -> bool:
        """Run ``job`` on this thread now if nothing is running or queued; False if
        it must be queued instead. ``job``'s exception propagates to the caller."""
        with self._lock:  # the condition's lock, without Condition's Python-level __enter__
            if self._busy or self._queue or self._closed:
                return False
            self._busy = True
        try:
            job()
        finally:
            with self._lock:
                self._busy = False
                if self._queue:
                    self._cond.notify_all()
        return True

    def leave(self) -> None:
        """End a job run on the caller's thread after the owner marked this executor busy
        under its lock (``claim``: the socket backend's thin lane, ``SocketBackend._inline``).

        Unlike ``run_inline``'s end, ``_busy`` is cleared without the lock (a store,
        atomic under the GIL), and the lock is taken only to wake the worker when a
        job is queued: a thread that queued one did so under the lock after seeing
        ``_busy`` set, so before this store, and the check of ``_queue`` that follows
        the store sees it; a thread that sees ``_busy`` clear runs or queues as on an
        idle executor."""
        self._busy = False
        if self._queue:
            with self._lock:
                self._cond.notify_all()

    def submit(self, work: Work, job, blocking: bool) -> Work:
        with self._cond:
            if self._closed:
                work.fail(DistBackendError(f"{self.name}: backend is closed"))
                return work
            inline = blocking and not self._busy and not self._queue
            if inline:
                self._busy = True
                self.current = work
            else:
                self._queue.append((work, job))
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, name=f"ndist-{self.name}", daemon=True)
                    self._thread.start()
                self._cond.notify_all()
        if inline:
            try:
                _run(work, job)
            finally:
                with self._cond:
                    self._busy = False
                    self.current = None
                    if self._queue:
                        self._cond.notify_all()
        return work

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (self._busy or not self._queue):
                    self._cond.wait()
                if self._closed:
                    return
                work, job = self._queue.popleft()
                self._busy = True
                self.current = work
            try:
                _run(work, job)
            finally:
                with self._cond:
                    self._busy = False
                    self.current = None
                    self._cond.notify_all()

    def ahead(self, work: Work) -> int | None:
        """How many operations run or wait before ``work`` (None: it is not queued)."""
        with self._lock:
            for i, (queued, _) in enumerate(self._queue):
                if queued is work:
                    return i + (1 if self._busy else 0)
        return None

    def drain(self, deadline: float) -> bool:
        """Wait until every queued job has run (or ``deadline``, a ``time.monotonic()``
        value, passed); True when idle."""
        with self._cond:
            while self._busy or self._queue:
                if self._closed:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))  # (an inline job does not notify)
            return not (self._busy or self._queue)

    def close(self, reason: str) -> None:
        with self._cond:
            self._closed = True
            queued = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for work, _ in queued:
            work.fail(DistBackendError(f"{self.name}: {reason}"))
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=2.0)
