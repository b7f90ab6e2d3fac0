"""``NdistWork``: a torch ``Work`` over one or more ndist Works.

torch (and DDP's C++ reducer) use a backend's Work through ``wait()``,
``get_future()`` (a ``torch.futures.Future`` whose value is the op's output
tensors), ``is_completed()``, ``is_success()``, ``exception()``,
``result()`` and, for a receive from any rank, ``_source_rank()``.

ndist's errors reach torch as torch's own types (``as_torch_error``), with
ndist's message (which names the failed peer) and the ndist error as
``__cause__``: a lost peer is ``torch.distributed.DistNetworkError``, a store
failure ``DistStoreError``, every other failure ``DistBackendError``. Bad
arguments stay ``ValueError`` / ``TypeError``.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any, Sequence

import torch
import torch.distributed as tdist

from ..runtime import DistError, DistNetworkError, DistStoreError

__all__ = ["NdistWork", "as_torch_error", "done_work"]


def as_torch_error(exc: BaseException) -> BaseException:
    """The exception torch code expects for ndist's ``exc`` (itself if it is not a DistError)."""
    if not isinstance(exc, DistError) or isinstance(exc, tdist.DistError):
        return exc
    if isinstance(exc, DistNetworkError):
        cls = tdist.DistNetworkError
    elif isinstance(exc, DistStoreError):
        cls = tdist.DistStoreError
    else:
        cls = tdist.DistBackendError
    err = cls(f"{type(exc).__name__}: {exc}")
    err.__cause__ = exc
    # the lost peer, when ndist knows it; a lost member's group ranks (DistRankFailureError)
    for attr in ("rank", "host", "failed_ranks", "hosts", "causes"):
        if hasattr(exc, attr):
            try:
                setattr(err, attr, getattr(exc, attr))
            except AttributeError:
                pass
    return err


class _Failed:
    """The value a failed op's inner future completes with (see ``NdistWork``)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _unwrap(fut: torch.futures.Future):
    value = fut.value()
    if isinstance(value, _Failed):
        raise value.error
    return value


def _seconds(timeout: Any) -> float | None:
    """torch's timeouts: a timedelta (<= 0 or torch's "unset" mean none), or seconds."""
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        s = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        s = float(timeout)
    else:
        raise TypeError(f"timeout: expected datetime.timedelta or None, got {type(timeout).__name__}")
    return s if s > 0 else None


class NdistWork(tdist.Work):
    """One torch Work for the ndist ``works`` of a call; ``outputs`` is its result.

    ``default_timeout`` (seconds) bounds ``wait()`` without a timeout, so a
    wait never outlives the group timeout. ``source`` maps the receive's
    sender (a group rank) for ``_source_rank()``.

    A Work with no ``works`` (a blocking call that already ran, or ``error``)
    is complete when made, and costs no lock, callback or future: torch's
    public functions make one per blocking call and drop it after ``wait()``.
    A pending Work learns its state from its ndist works when asked
    (``is_completed()``, ``wait()``), and registers callbacks on them only when
    its future is asked for (DDP's reducer always asks).
    """

    # What every Work sets lives in slots: a Python subclass of torch's Work otherwise
    # stores each attribute in its __dict__ at several times the cost. The state of a
    # Work complete when made (the most frequent: one per blocking call) is the class
    # default, so ``done_work`` sets four slots; a pending or failed Work sets the
    # rest (in __dict__, kept so that torch code can still set attributes on a Work).
    __slots__ = ("_outputs", "_timeout", "_op", "_fut", "__dict__")  # _fut: read by get_future
    _works: Sequence[Any] = ()
    _error: BaseException | None = None
    _done = True
    _lock: Any = None
    _inner: torch.futures.Future | None = None
    _left = 0

    def __init__(self, works: Sequence[Any], outputs: list, default_timeout: float, op: str,
                 error: BaseException | None = None) -> None:
        tdist.Work.__init__(self)
        self._outputs = outputs
        self._timeout = default_timeout
        self._op = op
        self._fut = None
        if error is not None:
            self._error = as_torch_error(error)
        elif works:
            self._works = works if type(works) is list else list(works)
            self._done = False
            self._lock = threading.Lock()

    # ------------------------------------------------------------ completion
    def _poll(self) -> bool:
        """Whether the Work is complete: settled when every ndist work succeeded or one failed."""
        if self._done:
            return True
        pending = False
        for w in self._works:
            if not w.is_completed():
                pending = True
            elif (exc := w.exception()) is not None:
                self._finish(exc)
                return True
        if pending:
            return False
        self._finish(None)
        return True

    def _one_done(self, fut) -> None:
        exc = fut.exception()
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if exc is not None or last:
            self._finish(exc)

    def _finish(self, exc: BaseException | None) -> None:
        with self._lock:
            if self._done:
                return
            if exc is not None:
                self._error = as_torch_error(exc)
            self._done = True
            inner = self._inner
        if inner is not None:  # outside the lock: torch runs the future's callbacks (DDP's) here
            self._settle(inner)

    def _settle(self, inner: torch.futures.Future) -> None:
        inner.set_result(_Failed(self._error) if self._error is not None else self._outputs)

    # -------------------------------------------------------------- torch API
    def wait(self, timeout: timedelta | None = None) -> bool:
        if self._done and timeout is None:  # a blocking call's Work: nothing to wait for
            if self._error is not None:
                raise self._error
            return True
        works = self._works
        if timeout is None and len(works) == 1:  # one op, the group's timeout: no deadline to share
            w = works[0]
            try:
                w.wait(self._timeout)
            except BaseException as exc:  # noqa: BLE001 - re-raised as torch's type
                self._raise_failed(w, exc)
        else:
            seconds = _seconds(timeout)
            deadline = time.monotonic() + (self._timeout if seconds is None else seconds)
            for w in works:
                try:
                    w.wait(max(deadline - time.monotonic(), 0.0))
                except BaseException as exc:  # noqa: BLE001 - re-raised as torch's type
                    self._raise_failed(w, exc)
        if not self._done:
            self._finish(None)  # every work succeeded (the callbacks may not have run yet)
        if self._error is not None:
            raise self._error
        return True

    def _raise_failed(self, w, exc: BaseException):
        """Raise what ``wait()`` raises when ndist's ``w.wait()`` raised ``exc``."""
        if w.is_completed():  # failed (not just late): settled now, not when the callback runs
            self._finish(exc)
        err = self._error if self._error is not None else as_torch_error(exc)
        if err is exc:
            raise exc
        raise err from exc

    def get_future(self) -> torch.futures.Future:
        # torch.futures.Future.set_exception only stores the exception as the value, which
        # C++ consumers (DDP's reducer) then read as tensors and crash on. A callback that
        # raises marks a chained future failed in C++ (inner.then(_unwrap)), so the error
        # reaches them as one.
        fut = self._fut
        if fut is not None:
            return fut
        if self._lock is None:  # complete when made: settled at once, nothing races
            return self._settled_future()
        with self._lock:
            fut = self._fut
            if fut is not None:
                return fut
            if self._done:
                return self._settled_future()
            inner = self._inner = torch.futures.Future()  # _finish settles it
            fut = self._fut = inner.then(_unwrap)
            self._left = len(self._works)
        for w in self._works:  # a work already complete calls back at once
            w.get_future().add_done_callback(self._one_done)
        return fut

    def _settled_future(self) -> torch.futures.Future:
        """The future of a Work already settled: its outputs, or failed with its error."""
        if self._error is None:  # no chained future needed: nothing can fail any more
            fut = self._fut = torch.futures.Future()
            fut.set_result(self._outputs)
            return fut
        inner = self._inner = torch.futures.Future()
        fut = self._fut = inner.then(_unwrap)
        self._settle(inner)
        return fut

    def is_completed(self) -> bool:
        return self._poll()

    def is_success(self) -> bool:
        return self._poll() and self._error is None

    def exception(self):
        self._poll()
        return self._error

    def result(self) -> list:
        self.wait()
        return list(self._outputs)

    def synchronize(self) -> None:
        self.wait()

    def _source_rank(self) -> int:
        """The group rank a receive from any rank got its message from."""
        self.wait()
        (source,) = self._works[0].result()
        return int(source)

    def source_rank(self) -> int:
        return self._source_rank()

    def __repr__(self) -> str:
        state = "pending" if not self._poll() else ("failed" if self._error is not None else "ok")
        return f"<NdistWork {self._op} {state}>"


_new_work = tdist.Work.__new__
_init_work = tdist.Work.__init__


def done_work(outputs: list, default_timeout: float, op: str) -> NdistWork:
    """``NdistWork((), outputs, default_timeout, op)`` (a blocking call's Work, complete
    when made), made without the Python ``__init__`` call: torch's public functions
    make one per blocking call and drop it after ``wait()``."""
    work = _new_work(NdistWork)
    _init_work(work)
    work._outputs = outputs
    work._timeout = default_timeout
    work._op = op
    work._fut = None
    return work
