"""Work: the handle of one (possibly asynchronous) operation.

A backend creates a ``Work`` when it accepts an operation and completes it
exactly once, with ``_complete()`` or ``_fail(exc)``, from whichever thread
finished the operation. The user waits on it; ``wait()`` re-raises the stored
error, typed.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from datetime import timedelta
from typing import Any, Callable

from ._errors import DistTimeoutError

__all__ = ["Work"]


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
    number within its group (-1 when the backend has none), ``outputs`` is
    what ``result()`` returns once the work succeeded. ``pending`` is an
    optional callable the backend provides that describes, on a timeout, what
    is still outstanding (e.g. ``"ranks not heard from: [2, 3]"``).
    """

    __slots__ = ("op", "seq", "_outputs", "_future", "_pending", "_lock", "_on_timeout", "__weakref__")

    def __init__(
        self,
        op: str,
        seq: int = -1,
        outputs: Any = None,
        pending: Callable[[], str] | None = None,
    ) -> None:
        self.op = op
        self.seq = seq
        self._outputs = outputs
        self._future: Future = Future()
        self._future.set_running_or_notify_cancel()
        self._pending = pending
        self._lock = threading.Lock()
        self._on_timeout: Callable[[BaseException], None] | None = None  # diagnostics hook (flight recorder)

    # ------------------------------------------------------------ completion
    @classmethod
    def completed(cls, op: str, seq: int = -1, outputs: Any = None) -> "Work":
        """A Work that has already succeeded (synchronous backends)."""
        work = cls(op, seq, outputs)
        work._complete()
        return work

    @classmethod
    def failed(cls, op: str, exc: BaseException, seq: int = -1) -> "Work":
        work = cls(op, seq)
        work._fail(exc)
        return work

    def _complete(self) -> None:
        with self._lock:
            if not self._future.done():
                self._future.set_result(self._outputs)

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if not self._future.done():
                self._future.set_exception(exc)

    def then(self, fn: Callable[[], None], op: str | None = None) -> "Work":
        """A Work that completes after this one and after ``fn()`` ran.

        Used to write staged outputs back once the backend is done; if this
        work or ``fn`` fails, the returned work fails with that error.
        """
        chained = Work(op or self.op, self.seq, self._outputs, self._pending)

        def _done(fut: Future) -> None:
            exc = fut.exception()
            if exc is not None:
                chained._fail(exc)
                return
            chained._outputs = fut.result()  # set at completion (e.g. recv's [source])
            try:
                fn()
            except BaseException as err:  # noqa: BLE001 - delivered to the waiter
                chained._fail(err)
            else:
                chained._complete()

        self._future.add_done_callback(_done)
        return chained

    # ------------------------------------------------------------- user API
    def wait(self, timeout: float | timedelta | None = None) -> bool:
        """Block until the operation completed; re-raise its error if it failed.

        Raises ``DistTimeoutError`` naming the op, its sequence number and what
        is outstanding if it has not completed within ``timeout``.
        """
        seconds = _seconds(timeout)
        done = self._future_done(seconds)
        if not done:
            detail = ""
            if self._pending is not None:
                try:
                    detail = "; " + self._pending()
                except Exception:  # noqa: BLE001 - diagnostics only
                    detail = ""
            exc = DistTimeoutError(f"{self.op} (#{self.seq}) did not complete within {seconds:g} s{detail}")
            hook = getattr(self, "_on_timeout", None)  # subclasses may skip __init__
            if hook is not None:
                try:
                    hook(exc)
                except Exception:  # noqa: BLE001 - diagnostics must not hide the timeout
                    pass
            raise exc
        exc = self._future.exception()
        if exc is not None:
            raise exc
        return True

    def _future_done(self, seconds: float | None) -> bool:
        try:
            self._future.exception(timeout=seconds)
        except TimeoutError:
            return False
        return True

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        return self._future.done() and self._future.exception() is None

    def exception(self) -> BaseException | None:
        """The error the operation failed with, or ``None`` (also while running)."""
        if not self._future.done():
            return None
        return self._future.exception()

    def get_future(self) -> Future:
        """A ``concurrent.futures.Future`` that resolves to ``result()``."""
        return self._future

    def result(self) -> Any:
        """Wait, then return the operation's output tensors (a list), like torch."""
        self.wait()
        out = self._outputs
        if out is None:
            return []
        return out if isinstance(out, list) else [out]

    def synchronize(self) -> None:
        self.wait()

    def __repr__(self) -> str:
        state = "pending"
        if self._future.done():
            state = "ok" if self._future.exception() is None else "failed"
        return f"<Work {self.op} #{self.seq} {state}>"
