"""CUDA-event Work and the watchdog that completes it.

An NCCL operation is *enqueued* on a CUDA stream; the host call returns at
once. Its ``CudaWork`` holds a CUDA event recorded on that stream right after
the operation, with torch's semantics:

* ``wait()`` (no timeout) makes the *current* stream wait on the event and
  returns without blocking the host; ``wait(timeout)`` blocks the host until
  the operation finished (or raises ``DistTimeoutError``);
* ``synchronize()`` blocks the host until the event fired;
* ``is_completed()`` / ``get_future()`` reflect the GPU finishing the work.

One watchdog thread per backend polls the pending events in order, checks the
communicator for asynchronous NCCL errors, and enforces the group timeout: on
an error or a timeout it asks the backend to abort the communicator (so that
the kernels stuck waiting for a peer exit) and fails every pending Work.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from ....runtime._future import Future  # torch.futures API on a concurrent.futures.Future
from typing import Any, Callable

from ....runtime import DistTimeoutError, Work

__all__ = ["CudaWork", "Watchdog"]

log = logging.getLogger("ndist.collectives.nccl")


class CudaWork(Work):
    """A Work completed by a CUDA event (see the module docstring).

    Its ``concurrent.futures.Future`` is created only when someone asks for it
    (``get_future()``, ``wait(timeout)``, ``then``): enqueueing an operation
    and completing it from the watchdog then cost a flag, not a Future.
    """

    __slots__ = ("_event", "_check", "_state", "_error", "_after")

    #: ``wait()`` without a timeout does not block the host (torch semantics):
    #: callers with ``async_op=False`` should call ``wait()`` without one.
    stream_ordered = True

    _PENDING, _OK, _FAILED = 0, 1, 2

    def __init__(self, op: str, seq: int, event: Any, check: Callable[[], BaseException | None],
                 outputs: Any = None, pending: Callable[[], str] | None = None) -> None:
        # Not Work.__init__: the Future is made lazily (see get_future).
        self.op = op
        self.seq = seq
        self._outputs = outputs
        self._pending = pending
        self._future = None
        self._lock = threading.Lock()
        self._event = event
        self._check = check
        self._state = self._PENDING
        self._error: BaseException | None = None
        self._after: list | None = None  # then() steps deferred while a coalescing block is open

    # ------------------------------------------------------------ completion
    def _complete(self) -> None:
        with self._lock:
            if self._state:
                return
            self._state = self._OK
            fut = self._future
        if fut is not None:
            fut.set_result(self._outputs)

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self._state:
                return
            self._state = self._FAILED
            self._error = exc
            fut = self._future
        if fut is not None:
            fut.set_exception(exc)

    def _poll(self) -> bool:
        """Complete (or fail) the work if its event fired; True once done."""
        if self._state:
            return True
        if self._event is None or not self._event.done:  # None: its coalescing block is open
            return False
        err = self._check()
        if err is None:
            self._complete()
        else:
            self._fail(err)
        return True

    def get_future(self) -> Future:
        with self._lock:
            if self._future is None:
                fut: Future = Future()
                fut.set_running_or_notify_cancel()
                if self._state == self._OK:
                    fut.set_result(self._outputs)
                elif self._state == self._FAILED:
                    fut.set_exception(self._error)
                self._future = fut
            return self._future

    def then(self, fn: Callable[[], None], op: str | None = None) -> Work:
        """Run ``fn`` now, stream-ordered, and return a Work that also covers it.

        On CUDA a write-back (e.g. copying a staged output into a
        non-contiguous tensor) is a device copy: enqueued on the current stream
        right after the operation it is ordered after it, as torch does; it
        must not wait on the host for the operation to finish.
        """
        if self._event is None:
            # Issued inside a coalescing block: NCCL launches the op at groupEnd, so the
            # step runs then (the backend calls run_deferred) and shares the block's event.
            chained = CudaWork(op or self.op, self.seq, None, self._check, self._outputs, self._pending)
            if self._after is None:
                self._after = []
            self._after.append((fn, chained))
            return chained
        import cupy

        try:
            fn()
        except BaseException as err:  # noqa: BLE001 - delivered to the waiter
            return Work.failed(op or self.op, err, self.seq)
        event = cupy.cuda.Event(block=False, disable_timing=True)
        event.record()
        chained = CudaWork(op or self.op, self.seq, event, self._check, self._outputs, self._pending)

        def _done(fut) -> None:
            exc = fut.exception()
            if exc is not None:
                chained._fail(exc)
            else:
                event.synchronize()  # only the write-back copies remain
                chained._poll()

        self.get_future().add_done_callback(_done)
        return chained

    def run_deferred(self) -> list["CudaWork"]:
        """Run the then() steps deferred by a coalescing block; return their chained works."""
        chained_works = []
        for fn, chained in self._after or ():
            try:
                fn()
            except BaseException as err:  # noqa: BLE001 - delivered to the waiter
                chained._fail(err)
            chained_works.append(chained)
            chained_works.extend(chained.run_deferred())
        self._after = None
        return chained_works

    # ------------------------------------------------------------- user API
    def wait(self, timeout=None) -> bool:
        if timeout is not None:
            # torch: an explicit timeout blocks the host until completion.
            self.get_future()
            return super().wait(timeout)
        if self._state == self._FAILED:
            raise self._error
        if self._state == self._PENDING:
            if self._event is None:
                raise RuntimeError(f"{self.op} (#{self.seq}): cannot wait inside the coalescing block that issued it")
            import cupy

            cupy.cuda.get_current_stream().wait_event(self._event)
        return True

    def synchronize(self) -> None:
        """Block the host until the operation finished on the GPU; raise its error."""
        if not self._state:
            if self._event is None:
                raise RuntimeError(f"{self.op} (#{self.seq}): cannot wait inside the coalescing block that issued it")
            self._event.synchronize()
            self._poll()
        if self._state == self._FAILED:
            raise self._error

    def is_completed(self) -> bool:
        return self._poll()

    def is_success(self) -> bool:
        return self._poll() and self._state == self._OK

    def exception(self) -> BaseException | None:
        self._poll()
        return self._error

    def __repr__(self) -> str:
        state = ("pending", "ok", "failed")[self._state]
        return f"<CudaWork {self.op} #{self.seq} {state}>"


class _Entry:
    __slots__ = ("work", "deadline", "keepalive")

    def __init__(self, work: CudaWork, deadline: float, keepalive: Any) -> None:
        self.work = work
        self.deadline = deadline
        self.keepalive = keepalive  # temporaries the GPU still reads or writes


class Watchdog:
    """Polls pending CudaWorks of one backend on a daemon thread.

    Works only need an event with ``done`` (and ``synchronize()``), so the
    loop is exercised on CPU-only machines with host-side events.

    ``check()`` returns the communicator's asynchronous error (or None);
    ``on_fatal(exc)`` aborts the communicator; afterwards every pending work
    fails with ``exc``.
    """

    def __init__(self, name: str, device: Callable[[], Any], check: Callable[[], BaseException | None],
                 on_fatal: Callable[[BaseException], None], poll_s: float = 0.0005) -> None:
        self._name = name
        self._device = device  # () -> context manager making the backend's device current
        self._check = check
        self._on_fatal = on_fatal
        self._poll_s = poll_s
        self._entries: deque[_Entry] = deque()
        self._cond = threading.Condition()
        self._stopped = False
        self._idle = False
        self._thread: threading.Thread | None = None

    def add(self, work: CudaWork, timeout_s: float, keepalive: Any = None) -> None:
        entry = _Entry(work, time.monotonic() + timeout_s, keepalive)
        if self._stopped:
            raise RuntimeError("watchdog stopped")
        self._entries.append(entry)  # deque.append is atomic; the loop only pops from the left
        if self._idle or self._thread is None:
            with self._cond:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name=f"ndist-nccl-watchdog-{self._name}",
                                                    daemon=True)
                    self._thread.start()
                self._cond.notify()

    def pending(self) -> list[CudaWork]:
        with self._cond:
            return [e.work for e in self._entries if not e.work._state]

    def fail_all(self, exc: BaseException) -> None:
        entries = []
        with self._cond:
            while True:  # popleft one by one: a concurrent add() appends on the right
                try:
                    entries.append(self._entries.popleft())
                except IndexError:
                    break
        for e in entries:
            e.work._fail(exc)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    # ------------------------------------------------------------ the loop
    def _run(self) -> None:
        try:
            with self._device():
                self._loop()
        except BaseException:  # noqa: BLE001 - a dead watchdog must be visible
            log.exception("nccl watchdog for %s died", self._name)

    def _head(self) -> _Entry | None:
        try:
            return self._entries[0]
        except IndexError:
            return None

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._entries and not self._stopped:
                    self._idle = True
                    # The timeout covers an add() that saw _idle still False just before it was set.
                    self._cond.wait(0.05)
                self._idle = False
                if self._stopped:
                    return
            # One communicator check per round, then complete works from the left while
            # their events fired (one stream completes in order; the rest waits a round).
            err = self._check()
            head = self._head()
            while err is None and head is not None:
                work = head.work
                if not work._state:
                    if not work._event.done:
                        break
                    work._complete()
                with self._cond:
                    if self._entries and self._entries[0] is head:  # fail_all() may have emptied it
                        self._entries.popleft()
                head = self._head()
            if err is None and head is not None and time.monotonic() > head.deadline:
                detail = head.work._pending() if head.work._pending is not None else ""
                err = DistTimeoutError(
                    f"nccl {head.work.op} (#{head.work.seq}) on {self._name} did not complete within "
                    f"the group timeout; the NCCL communicator was aborted{'; ' + detail if detail else ''}"
                )
            if err is not None:
                log.error("nccl %s: %s", self._name, err)
                try:
                    self._on_fatal(err)
                finally:
                    self.fail_all(err)
                continue
            if head is not None:
                time.sleep(self._poll_s)
