"""The threads that run user callbacks of engine futures.

A user's callback on a Work's future (``get_future().then(cb)``,
``add_done_callback``, torch's ``Future.then`` through ``ndist.torch``) may
start a collective and wait on it, as DDP's PowerSGD hook does, three callbacks
deep. The thread that completes a Work is the one that progresses the group's
collectives (a backend's worker, a watchdog, an MPI helper), so such a callback
can never run there: the collective it waits on would queue behind it. ``run``
hands the callbacks of one completion, as one job in their order, to a callback
thread instead.

There is always a thread free to take a job: an idle one, or a new one when
every callback thread is busy (each may be blocked in a wait, nested callbacks
included, which is why no fixed number of them can be enough). A thread idle for
``IDLE_S`` exits. After ``fork`` the child starts with none.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from typing import Callable

__all__ = ["run", "IDLE_S"]

log = logging.getLogger("ndist.runtime")

#: seconds a callback thread waits for a job before it exits
IDLE_S = 10.0

_cond = threading.Condition(threading.Lock())
_jobs: deque = deque()
_idle = 0  # threads waiting for a job


def run(job: Callable[[], None]) -> None:
    """Run ``job()`` on a callback thread, soon, whatever the others are doing.

    ``job``'s exceptions are logged (the stdlib's callbacks log their own)."""
    with _cond:
        _jobs.append(job)
        if _idle >= len(_jobs):  # a waiting thread for this job too: wake one
            _cond.notify()
            return
    threading.Thread(target=_loop, name="ndist-callbacks", daemon=True).start()


def _loop() -> None:
    global _idle
    while True:
        with _cond:
            while not _jobs:
                _idle += 1
                try:
                    woken = _cond.wait(IDLE_S)
                finally:
                    _idle -= 1
                if not woken and not _jobs:
                    return
            job = _jobs.popleft()
        try:
            job()
        except BaseException:  # noqa: BLE001 - a callback's error must not end the thread
            log.exception("a future's callback raised")
        # An idle thread keeps nothing: the job holds its future, whose callbacks may hold a
        # Work, its backend and the store (torch's file:// store is deleted with its last user).
        del job


def _reset_after_fork() -> None:
    global _cond, _jobs, _idle
    _cond = threading.Condition(threading.Lock())
    _jobs = deque()
    _idle = 0


os.register_at_fork(after_in_child=_reset_after_fork)
