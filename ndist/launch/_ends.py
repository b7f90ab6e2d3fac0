"""Every rank's end, told to the job's store: a rank that ended before it joined is named.

A rank that ends (any exit status, a signal, or a program that never started) before it
joined its first ``init_process_group`` would leave the ranks waiting for it in the join
until their timeout. The agent sees the end at once, and tells the store the ranks use
(``ndist.runtime``'s ``_ended.mark_ended``): the mark lands in the rank's claim only if it
had not joined, so it is also the agent's verdict, and every rank waiting for it raises
``DistRankFailureError`` naming it. The agent uses the verdicts for its report: a failed
rank that ended before it joined, in a job whose ranks join groups (one claimed its rank),
is reported so (``Failure.before_join``). For a rank that exited 0 before it joined, the
agent asks the store whether a rank waited for it there: then it failed the job
(``--on-failure stop``) or is lost (``continue``) rather than finished. A program that never
calls ``init_process_group`` is reported as before.

The store calls run on one thread of their own, in order: on a node other than node 0 the
store is remote, and a store that no longer answers must not hold the agent's monitor loop.
Each question (``before_join``, ``waited_for``) waits a bounded time for its answer; no answer
is ``None`` / nothing (the report then says less, nothing waits).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass

from ._workers import how_it_ended

__all__ = ["End", "EndNotices"]

log = logging.getLogger("ndist.launch")


@dataclass(frozen=True)
class End:
    """One rank's end, as the agent saw it."""

    rank: int
    local_rank: int
    pid: int
    host: str
    returncode: int  # negative: killed by that signal
    timestamp: float  # time.time() when it was reaped


class EndNotices:
    """The ends of one attempt's local ranks, told to the job's store by one thread.

    ``open_store()`` makes this thread's own client of the job's store (on the thread, at
    the first end: nothing is paid before a rank ends); ``attempt`` is the ranks'
    ``NDIST_RESTART_COUNT``; ``world_size`` the job's ranks (every node's)."""

    def __init__(self, open_store, attempt: int, host: str, world_size: int) -> None:
        self._open_store = open_store
        self._attempt = attempt
        self._world_size = world_size
        self._host = host
        self._store = None
        self._broken = False  # the store failed once: every later task answers None
        self._claimed = False  # a rank of the job was seen to join (``claimed_any``)
        self._stalled = False  # an answer did not come in time: none is waited for any more
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._verdicts: dict[int, _Answer] = {}
        self.ends: dict[int, End] = {}  # by rank, in the order told
        self._thread = threading.Thread(target=self._run, name="ndistrun-ends", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the agent's side
    def tell(self, spec, pid: int, returncode: int) -> None:
        """``WorkerGroup.monitor``'s ``on_exit``: queue the end of ``spec``'s rank. Never blocks."""
        end = End(spec.rank, spec.local_rank, pid, self._host, returncode, time.time())
        self.ends[end.rank] = end
        self._verdicts[end.rank] = self._submit(self._mark, end)

    def before_join(self, rank: int, timeout: float) -> bool | None:
        """Whether ``rank`` (told) ended before it joined; None when unknown within ``timeout`` s."""
        answer = self._verdicts.get(rank)
        return None if answer is None else self._wait(answer, timeout)

    def waited_for(self, ranks: list[int], timeout: float) -> list[int]:
        """Those of ``ranks`` (ended before they joined) that a rank waited for in its join."""
        return self._wait(self._submit(self._waited, ranks), timeout) or []

    def claimed_any(self, timeout: float) -> bool:
        """Whether any rank of the job joined (claimed its rank in) its first
        ``init_process_group``: only then does a rank that ended before it joined matter
        (once True, it stays True). False when unknown within ``timeout`` s."""
        if not self._claimed:
            self._claimed = bool(self._wait(self._submit(self._claimed_any, self._world_size), timeout))
        return self._claimed

    def close(self) -> None:
        """Stop the thread once its queued tasks are done (it closes its store client); a
        thread held by a store that does not answer is left behind (a daemon)."""
        self._tasks.put(None)
        self._thread.join(0.0 if self._stalled else 1.0)

    def _wait(self, answer: "_Answer", timeout: float):
        """``answer``'s value within ``timeout`` s; after one answer did not come in time (the
        thread waits on a store that does not answer), later ones are not waited for."""
        value = answer.get(0.0 if self._stalled else timeout)
        if not answer.done:
            self._stalled = True
        return value

    # ------------------------------------------------------------ the thread
    def _submit(self, fn, arg) -> "_Answer":
        answer = _Answer()
        self._tasks.put((fn, arg, answer))
        return answer

    def _run(self) -> None:
        try:
            while True:
                task = self._tasks.get()
                if task is None:
                    return
                fn, arg, answer = task
                if self._broken:
                    answer.set(None)
                    continue
                try:
                    if self._store is None:
                        self._store = self._open_store()
                    answer.set(fn(arg))
                except Exception as err:  # noqa: BLE001 - the store is gone or refused: say it once
                    self._broken = True
                    log.warning("could not tell the job's store how a rank ended (%s): a rank waiting for it in "
                                "init_process_group waits its timeout", err)
                    answer.set(None)
        finally:
            if self._store is not None:
                self._store.close()

    def _mark(self, end: End) -> bool:
        from ndist.runtime._ended import mark_ended  # noqa: PLC0415 - import cost: only once a rank ends

        before = mark_ended(self._store, self._attempt, end.rank, host=end.host, pid=end.pid,
                            returncode=end.returncode, how=how_it_ended(end.returncode))
        if before:
            log.debug("rank %d ended before it joined the group (%s)", end.rank, how_it_ended(end.returncode))
        return before

    def _waited(self, ranks: list[int]) -> list[int]:
        from ndist.runtime._ended import waited_for  # noqa: PLC0415 - import cost (see _mark)

        return waited_for(self._store, self._attempt, ranks)

    def _claimed_any(self, world_size: int) -> bool:
        from ndist.runtime._ended import claimed_any  # noqa: PLC0415 - import cost (see _mark)

        return claimed_any(self._store, self._attempt, world_size)


class _Answer:
    """The thread's answer to one task (not ``concurrent.futures``: its import costs the
    launcher's start)."""

    __slots__ = ("_done", "_value")

    def __init__(self) -> None:
        self._done = threading.Event()
        self._value = None

    def set(self, value) -> None:
        self._value = value
        self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def get(self, timeout: float):
        """The answer, or None when it did not come within ``timeout`` s."""
        return self._value if self._done.wait(timeout) else None
