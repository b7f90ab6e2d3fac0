"""Work: the handle of one (possibly asynchronous) operation.

A backend creates a ``Work`` when it accepts an operation and completes it
exactly once, with ``complete()`` or ``fail(exc)``, from whichever thread
finished the operation. The user waits on it; ``wait()`` re-raises the stored
error, typed.

The ``concurrent.futures.Future`` behind ``get_future()`` is made only when
someone needs one (``get_future()``, ``then()``, a wait on unfinished work),
under the same lock that completion takes, so it always resolves exactly like
the work did. A synchronous collective is complete before its caller looks at
it: ``wait()`` then reads a flag. (A Future costs a Condition and several lock
round trips, about a quarter of the Python time of a 4 KiB all_reduce.)
Every backend's Work is this class or a subclass of it (``MPIWork`` progresses
an MPI request, ``CudaWork`` polls a CUDA event).

What a subclass or a backend may use besides the user API (the state itself
stays private to this module):

* ``complete()`` / ``fail(exc)``: end the work, once;
* ``finished``, ``succeeded``, ``error``: its state as recorded, read without
  driving the work (unlike ``is_completed()``, ``is_success()`` and
  ``exception()``, which a lazily completed subclass overrides to look at its
  operation first);
* ``progress(timeout)``: the hook ``wait()`` calls on unfinished work. The base
  waits for ``complete()``/``fail()`` from the backend's thread; a Work that
  completes only when someone drives it (``MPIWork``) overrides it;
* ``add_done_hook(fn)``: library code's step after completion (write a staged
  output back, record the op as done), run on the thread that completed the
  work; it must not block.

Callbacks are the user's (``add_done_callback``, ``get_future().then``): those
registered while the work is pending run on a callback thread, never on the
thread that completed the work (``_future.WorkFuture``), so a callback may start
a collective and wait on it.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any, Callable

from ._errors import DistTimeoutError
from ._future import Future, WorkFuture  # a concurrent.futures.Future with torch.futures' API

__all__ = ["Work"]

log = logging.getLogger("ndist.runtime")

PENDING, OK, FAILED = 0, 1, 2


def _seconds(timeout: float | timedelta | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        return float(timeout)
    raise TypeError(
        f"timeout: expected seconds (int/float), datetime.timedelta or None, got {type(timeout).__name__}"
    )


class Work:
    """Handle of an operation, as returned by a collective with ``async_op=True``.

    ``op`` names the operation (``"all_reduce"``), ``seq`` is its sequence
    number within its group (-1 when the backend has none). ``outputs`` is
    what ``result()`` returns once the work succeeded; a backend that learns
    it only at completion (recv's source rank) sets it before ``complete()``.
    ``pending`` is an optional callable the backend provides that describes,
    on a timeout, what is still outstanding (``"ranks not heard from: [2, 3]"``);
    it may first wait briefly for the op's own outcome (an op past its own
    deadline), and if the op ended meanwhile ``wait`` returns or raises that.
    ``on_timeout`` is an optional callable the collectives layer sets (the
    flight recorder's dump), called with the timeout error before it is raised.
    """

    __slots__ = ("op", "seq", "outputs", "pending", "on_timeout", "_lock", "_fut", "_hooks", "_state", "_exc",
                 "__weakref__")

    def __init__(
        self,
        op: str,
        seq: int = -1,
        outputs: Any = None,
        pending: Callable[[], str] | None = None,
    ) -> None:
        self.op = op
        self.seq = seq
        self.outputs = outputs
        self.pending = pending
        self.on_timeout: Callable[[BaseException], None] | None = None
        self._lock = threading.Lock()
        self._fut: Future | None = None
        self._hooks: list | None = None
        self._state = PENDING
        self._exc: BaseException | None = None

    # ------------------------------------------------------------ completion
    @classmethod
    def completed(cls, op: str, seq: int = -1, outputs: Any = None) -> "Work":
        """A Work that has already succeeded (synchronous backends)."""
        work = cls(op, seq, outputs)
        work.complete()
        return work

    @classmethod
    def failed(cls, op: str, exc: BaseException, seq: int = -1) -> "Work":
        work = cls(op, seq)
        work.fail(exc)
        return work

    def complete(self) -> None:
        """Mark the work succeeded (once; later calls are ignored)."""
        with self._lock:
            if self._state != PENDING:
                return
            self._state = OK
            fut, hooks = self._fut, self._hooks
            self._hooks = None
        if fut is not None:
            fut.set_result(self.outputs)
        if hooks is not None:
            self._run_hooks(hooks)

    def fail(self, exc: BaseException) -> None:
        """Mark the work failed with ``exc`` (once; later calls are ignored)."""
        with self._lock:
            if self._state != PENDING:
                return
            self._exc = exc
            self._state = FAILED
            fut, hooks = self._fut, self._hooks
            self._hooks = None
        if fut is not None:
            fut.set_exception(exc)
        if hooks is not None:
            self._run_hooks(hooks)

    def _run_hooks(self, hooks: list) -> None:
        for fn in hooks:
            try:
                fn(self)
            except Exception:  # noqa: BLE001 - the others still run, as the stdlib's callbacks do
                log.exception("a completion hook of %r raised", self)

    def add_done_hook(self, fn: Callable[["Work"], None]) -> None:
        """Library code's ``fn(self)`` once the work completed, on the thread that
        completed it (at once if it already has). ``fn`` must not block: that thread
        progresses the group's collectives. (A user's callback is ``add_done_callback``.)"""
        with self._lock:
            if self._state == PENDING:
                if self._hooks is None:
                    self._hooks = [fn]
                else:
                    self._hooks.append(fn)
                return
        fn(self)

    @property
    def finished(self) -> bool:
        """``complete()`` or ``fail()`` has run (the flag only: never drives the work)."""
        return self._state != PENDING

    @property
    def succeeded(self) -> bool:
        """``complete()`` has run (the flag only: never drives the work)."""
        return self._state == OK

    @property
    def error(self) -> BaseException | None:
        """The error ``fail()`` recorded, else ``None`` (never drives the work)."""
        return self._exc if self._state == FAILED else None

    def progress(self, timeout: float | None) -> bool:
        """Hook: let the work advance for up to ``timeout`` seconds (None: until it
        completes); True once it has completed.

        ``wait()`` calls it on unfinished work. This Work is completed by its
        backend, from another thread: it waits for that. A subclass whose
        operation completes only when driven overrides it (``MPIWork`` tests
        its MPI request until the deadline).
        """
        try:
            self._future.exception(timeout=timeout)
        except TimeoutError:
            return False
        return True

    @property
    def _future(self) -> Future:
        """The Future, made on first use and resolved like the work."""
        with self._lock:
            fut = self._fut
            if fut is None:
                fut = self._fut = WorkFuture()
                fut.set_running_or_notify_cancel()
                if self._state == OK:
                    fut.set_result(self.outputs)
                elif self._state == FAILED:
                    fut.set_exception(self._exc)
            return fut

    def add_done_callback(self, fn: Callable[["Work"], None]) -> None:
        """Call ``fn(self)`` once the work completed: on a callback thread, or at once
        on this one if it already has. ``fn`` may start a collective and wait on it."""
        self._future.add_done_callback(lambda _fut: fn(self))

    def then(self, fn: Callable[[], None], op: str | None = None) -> "Work":
        """A Work that completes after this one and after ``fn()`` ran.

        Used to write staged outputs back once the backend is done (``fn`` runs
        as a done hook: it must not block); if this work or ``fn`` fails, the
        returned work fails with that error. The chained work's ``outputs`` are
        this one's at completion.
        """
        chained = Work(op or self.op, self.seq, self.outputs, self.pending)

        def _done(work: Work) -> None:
            exc = work.error
            if exc is not None:
                chained.fail(exc)
                return
            chained.outputs = work.outputs  # set at completion (e.g. recv's [source])
            try:
                fn()
            except BaseException as err:  # noqa: BLE001 - delivered to the waiter
                chained.fail(err)
            else:
                chained.complete()

        self.add_done_hook(_done)
        return chained

    # ------------------------------------------------------------- user API
    def wait(self, timeout: float | timedelta | None = None) -> bool:
        """Block until the operation completed; re-raise its error if it failed.

        Raises ``DistTimeoutError`` naming the op, its sequence number and what
        is outstanding if it has not completed within ``timeout``.
        """
        seconds = _seconds(timeout)
        state = self._state
        if state == OK:
            return True
        if state == PENDING and not self.progress(seconds):
            detail = ""
            if self.pending is not None:
                try:
                    detail = "; " + self.pending()
                except Exception:  # noqa: BLE001 - diagnostics only
                    detail = ""
            if self._state != PENDING:  # it ended while ``pending`` looked (a backend may give
                return self.wait(0)  # an op past its own deadline the grace it gives its notices)
            exc = DistTimeoutError(f"{self.op} (#{self.seq}) did not complete within {seconds:g} s{detail}")
            if self.on_timeout is not None:
                try:
                    self.on_timeout(exc)
                except Exception:  # noqa: BLE001 - diagnostics must not hide the timeout
                    pass
            raise exc
        if self._state == FAILED:
            raise self._exc
        return True

    def is_completed(self) -> bool:
        return self._state != PENDING

    def is_success(self) -> bool:
        return self._state == OK

    def exception(self) -> BaseException | None:
        """The error the operation failed with, or ``None`` (also while running)."""
        return self._exc if self._state == FAILED else None

    def get_future(self) -> Future:
        """An ``ndist.futures.Future`` (torch's ``wait/value/then`` on a
        ``concurrent.futures.Future``) that resolves to ``result()``."""
        return self._future

    def result(self) -> Any:
        """Wait, then return the operation's output tensors (a list), like torch."""
        self.wait()
        out = self.outputs
        if out is None:
            return []
        return out if isinstance(out, list) else [out]

    def synchronize(self) -> None:
        self.wait()

    def __repr__(self) -> str:
        state = ("pending", "ok", "failed")[self._state]
        return f"<Work {self.op} #{self.seq} {state}>"
