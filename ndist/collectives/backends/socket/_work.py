"""SocketWork: a ``Work`` whose ``concurrent.futures.Future`` is made only when asked for.

A blocking collective that ran inline is complete before the caller waits, so
``wait()`` only needs to look at a flag: creating, resolving and querying a
Future (a Condition and several lock round trips) was about a quarter of the
Python time of a 4 KiB all_reduce. ``get_future()``, ``then()`` and a wait on
unfinished work create the Future under the same lock that completion takes,
so it always resolves exactly like the work did.
"""

from __future__ import annotations

import threading
from ....runtime._future import Future  # torch.futures API on a concurrent.futures.Future
from typing import Any

from ....runtime import Work
from ....runtime._work import _seconds

__all__ = ["SocketWork"]

_PENDING, _OK, _FAILED = 0, 1, 2


class SocketWork(Work):
    __slots__ = ("_fut", "_state", "_exc")

    def __init__(self, op: str, seq: int = -1, outputs: Any = None, pending=None) -> None:
        # Not Work.__init__: no Future until someone needs one (see _future).
        self.op = op
        self.seq = seq
        self._outputs = outputs
        self._pending = pending
        self._lock = threading.Lock()
        self._fut = None
        self._state = _PENDING
        self._exc = None

    @property
    def _future(self) -> Future:  # the base class's methods (then, get_future) use it
        with self._lock:
            fut = self._fut
            if fut is None:
                fut = Future()
                fut.set_running_or_notify_cancel()
                if self._state == _OK:
                    fut.set_result(self._outputs)
                elif self._state == _FAILED:
                    fut.set_exception(self._exc)
                self._fut = fut
            return fut

    def _complete(self) -> None:
        with self._lock:
            if self._state != _PENDING:
                return
            self._state = _OK
            fut = self._fut
        if fut is not None:
            fut.set_result(self._outputs)

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self._state != _PENDING:
                return
            self._exc = exc
            self._state = _FAILED
            fut = self._fut
        if fut is not None:
            fut.set_exception(exc)

    def wait(self, timeout=None) -> bool:
        _seconds(timeout)  # the same argument check as an unfinished wait
        state = self._state
        if state == _OK:
            return True
        if state == _FAILED:
            raise self._exc
        return super().wait(timeout)

    def is_completed(self) -> bool:
        return self._state != _PENDING

    def is_success(self) -> bool:
        return self._state == _OK

    def exception(self) -> BaseException | None:
        return self._exc if self._state == _FAILED else None
