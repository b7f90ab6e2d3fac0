"""``_MPIWork``: a ``Work`` driven by an MPI request.

MPI has no progress thread of its own that ndist could hook a callback on, so
the Work progresses its request when asked: ``wait`` calls ``Request.Wait``
(or polls ``Test`` until a timeout) through ``progress``, the hook of ``Work``
it overrides; ``is_completed`` and ``exception`` call ``Test``. ``finish`` runs
once the request completed (copy a staged buffer back, divide for AVG);
``then`` chains another step on the same request.
"""

from __future__ import annotations

import threading
import time
from ....runtime._future import Future  # torch.futures API on a concurrent.futures.Future
from typing import Any, Callable

from ....runtime import DistBackendError, Work

__all__ = ["MPIWork"]

_POLL_S = 0.0005


class MPIWork(Work):
    """A Work completed by progressing ``poll(block) -> bool``.

    ``poll(True)`` must block until the underlying operation completed and
    return ``True``; ``poll(False)`` returns whether it has completed.
    """

    __slots__ = ("_poll", "_finish", "_progress_lock", "_thread_lock", "_thread")

    def __init__(
        self,
        op: str,
        poll: Callable[[bool], bool],
        finish: Callable[[], Any] | None = None,
        outputs: Any = None,
    ) -> None:
        super().__init__(op, -1, outputs)
        self._poll = poll
        self._finish = finish
        self._progress_lock = threading.Lock()
        self._thread_lock = threading.Lock()
        self._thread = None

    @classmethod
    def for_request(cls, op: str, request, finish=None, outputs=None, status=None) -> "MPIWork":
        def poll(block: bool) -> bool:
            if block:
                request.Wait(status)
                return True
            return bool(request.Test(status))

        return cls(op, poll, finish, outputs)

    # ------------------------------------------------------------ progress
    def _advance(self, block: bool) -> bool:
        if self.finished:
            return True
        # A non-blocking probe never waits behind a thread blocked in Request.Wait
        # (get_future's helper): it reports "not yet" instead.
        if not self._progress_lock.acquire(blocking=block):
            return self.finished
        try:
            if self.finished:
                return True
            try:
                if not self._poll(block):
                    return False
                if self._finish is not None:
                    result = self._finish()
                    if result is not None:
                        self.outputs = result
            except BaseException as err:  # noqa: BLE001 - delivered to the waiter
                self.fail(_as_dist_error(self.op, err))
            else:
                self.complete()
            return True
        finally:
            self._progress_lock.release()

    def progress(self, timeout: float | None) -> bool:
        if timeout is None:
            return self._advance(True)
        deadline = time.monotonic() + timeout
        while not self._advance(False):
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)
        return True

    def is_completed(self) -> bool:
        return self._advance(False)

    def is_success(self) -> bool:
        return self._advance(False) and self.succeeded

    def exception(self) -> BaseException | None:
        self._advance(False)
        return self.error

    def get_future(self) -> Future:
        """A Future resolved by a helper thread that waits on the request."""
        fut = super().get_future()
        with self._thread_lock:
            if self._thread is None and not self.finished:
                self._thread = threading.Thread(
                    target=self._advance, args=(True,), name=f"ndist-mpi-{self.op}", daemon=True
                )
                self._thread.start()
        return fut

    def then(self, fn: Callable[[], None], op: str | None = None) -> "MPIWork":
        parent = self

        def poll(block: bool) -> bool:
            if not parent._advance(block):
                return False
            parent.wait()  # re-raise the parent's error, if any
            return True

        def finish():
            fn()
            return parent.outputs

        return MPIWork(op or self.op, poll, finish, self.outputs)


def _as_dist_error(op: str, err: BaseException) -> BaseException:
    from mpi4py import MPI

    if isinstance(err, MPI.Exception):
        return DistBackendError(f"mpi: {op} failed: {err.Get_error_string()} (MPI error class {err.Get_error_class()})")
    return err
