"""Future: torch.futures.Future's API on a ``concurrent.futures.Future``.

``Work.get_future()`` returns one. It is a subclass of the stdlib's Future,
so ``result(timeout)``, ``exception(timeout)``, ``done()``,
``add_done_callback`` and ``concurrent.futures.wait`` work as usual, and it
adds torch's ``wait()``, ``value()``, ``then(callback)`` and ``set_exception``
with torch's checks. ``collect_all`` / ``wait_all`` are torch.futures'.

A Work's future (``WorkFuture``) runs the callbacks registered while it was
pending on a callback thread (``_callbacks``), never on the thread that
completed the work, which is the one that progresses the group's collectives:
a callback may start a collective and wait on it. A callback registered on a
future already complete runs at once on the registering thread, and a
``Future`` the user completes with ``set_result`` runs its callbacks on that
thread, as torch's do.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, Callable, Iterable

__all__ = ["Future", "WorkFuture", "collect_all", "wait_all"]


class Future(concurrent.futures.Future):
    """A future with torch's API (``wait``, ``value``, ``then``) and the stdlib's.

    ``devices`` is accepted for torch compatibility and ignored (values are
    ready when the future completes; CUDA work is stream-ordered by the
    operation that completes it).
    """

    def __init__(self, *, devices: Iterable[Any] | None = None) -> None:
        super().__init__()
        self.devices = list(devices) if devices is not None else []

    def wait(self) -> Any:
        """Block until done; return the value, or raise the error it failed with."""
        return self.result()

    def value(self) -> Any:
        """The value of a completed future (raises its error); ``RuntimeError`` while
        it is still running (call ``wait()`` first, or use it inside ``then``)."""
        if not self.done():
            raise RuntimeError("Future.value(): the future has not completed yet; call wait() first")
        return self.result()

    def then(self, callback: Callable[["Future"], Any]) -> "Future":
        """A new Future holding ``callback(self)``'s return value, completed once
        ``callback`` ran after this one completed (inline if it already has).
        If ``callback`` raises, e.g. because it called ``wait()`` on a failed
        future, the new Future fails with that error."""
        if not callable(callback):
            raise TypeError(f"callback: expected a callable taking the future, got {type(callback).__name__}")
        child = Future(devices=self.devices)

        def _run(fut: "Future") -> None:
            try:
                value = callback(fut)
            except BaseException as err:  # noqa: BLE001 - delivered to the child's waiters
                child.set_exception(err)
            else:
                child.set_result(value)

        self.add_done_callback(_run)
        return child

    def set_exception(self, result: BaseException) -> None:  # torch names the argument ``result``
        """Complete with an error that ``wait()`` / ``value()`` / ``result()`` raise."""
        if not isinstance(result, BaseException):
            raise TypeError(f"result: expected an exception instance, got {type(result).__name__}")
        super().set_exception(result)


class WorkFuture(Future):
    """The Future of a Work (``Work.get_future()``): resolved by the thread that
    completed the work, its callbacks run on a callback thread (module docstring).

    The stdlib's ``set_result`` / ``set_exception`` release the waiters, then call
    ``_invoke_callbacks`` (CPython's ``concurrent.futures`` since 3.2, unchanged
    through 3.13), which runs ``_done_callbacks`` in order; this hands that call,
    the whole list in its order, to ``_callbacks.run`` when the list is not empty.
    """

    def _invoke_callbacks(self) -> None:
        if self._done_callbacks:
            # loaded on the first callback: `import ndist.distributed` does not pay for the pool
            from . import _callbacks  # noqa: PLC0415 - import cost, not a cycle

            _callbacks.run(super()._invoke_callbacks)


def _check_futures(futures: Any) -> list:
    if isinstance(futures, (str, bytes)) or not hasattr(futures, "__iter__"):
        raise TypeError(f"futures: expected a list of Future, got {type(futures).__name__}")
    futs = list(futures)
    for i, f in enumerate(futs):
        if not isinstance(f, concurrent.futures.Future):
            raise TypeError(f"futures[{i}]: expected a Future, got {type(f).__name__}")
    return futs


def collect_all(futures: list) -> Future:
    """A Future completed, with the list of ``futures``, when all of them are;
    it fails with the error of the first one that fails."""
    futs = _check_futures(futures)
    combined = Future()
    if not futs:
        combined.set_result([])
        return combined
    import threading

    lock = threading.Lock()
    remaining = [len(futs)]

    def _one(fut: concurrent.futures.Future) -> None:
        exc = fut.exception()
        with lock:
            if combined.done():
                return
            if exc is not None:
                combined.set_exception(exc)
                return
            remaining[0] -= 1
            if remaining[0] == 0:
                combined.set_result(futs)

    for f in futs:
        f.add_done_callback(_one)
    return combined


def wait_all(futures: list) -> list:
    """Wait for every future; return their values in order. Raises the first error."""
    return [f.result() for f in collect_all(futures).result()]
