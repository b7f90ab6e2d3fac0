"""A pool of CUDA events, reused once the watchdog saw them fire.

Making a ``cupy.cuda.Event`` costs a ``cudaEventCreateWithFlags`` (0.9-1.8 us
on an H100) and a destroy later; recording an event that already fired is all
an operation needs. The backend takes an event from the pool for each
operation; the watchdog gives it back once the event fired and the operation's
Work (if any) completed, so nothing looks at the event again.

Thread safety without a lock: the issuing thread pops, the watchdog's thread
appends, and ``collections.deque``'s ``pop``/``append`` are atomic. The pool
knows nothing of CUDA (``make`` makes an event), so its logic is tested with
host events.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

__all__ = ["EventPool"]


class EventPool:
    """Events made by ``make()``, handed out by ``acquire()`` and taken back by ``release()``.

    At most ``keep`` free events are kept (more are dropped, i.e. destroyed by
    their owner's finalizer); ``made`` counts the events ever made.
    """

    def __init__(self, make: Callable[[], Any], keep: int = 1024) -> None:
        if keep < 0:
            raise ValueError(f"keep: expected a count >= 0, got {keep}")
        self._make = make
        self._keep = keep
        self._free: deque = deque()
        self.made = 0

    def acquire(self) -> Any:
        """A free event (one that fired, or a new one)."""
        try:
            return self._free.pop()
        except IndexError:
            self.made += 1
            return self._make()

    def release(self, event: Any) -> None:
        """Take back ``event``: its last recording fired and nothing will query it again."""
        if len(self._free) < self._keep:
            self._free.append(event)

    def __len__(self) -> int:
        return len(self._free)

    def clear(self) -> None:
        self._free.clear()
