"""Shared pieces of the stopped-rank (SIGSTOP) tests in tests/reliability/."""

from __future__ import annotations

import os
import re
import signal
import time


def not_heard_from(msg: str | None) -> list | None:
    """The ranks a timeout's message says it had not heard from (the first such list)."""
    m = re.search(r"ranks not heard from: \[([^\]]*)\]", msg or "")
    return [int(s) for s in m.group(1).split(",")] if m and m.group(1).strip() else None


def finish(folder: str, rank: int, survivors, continuer: int, stopped_pid: int) -> None:
    """This survivor is done (its error recorded): write its file, stay until every one of
    ``survivors`` is done too (an exit would reset streams another still waits on), then
    ``continuer`` continues the stopped process (SIGCONT) so the job can end."""
    with open(os.path.join(folder, f"done{rank}"), "w"):
        pass
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(
            os.path.exists(os.path.join(folder, f"done{r}")) for r in survivors):
        time.sleep(0.01)
    if rank == continuer:
        os.kill(stopped_pid, signal.SIGCONT)


def open_streams(dist, rank: int, pairs) -> None:
    """A message from ``p`` to ``q`` for each pair: their point-to-point streams are up."""
    import numpy as np

    for p, q in pairs:
        if rank == p:
            dist.send(np.full(4, 1.0 * p), dst=q, tag=7)
        if rank == q:
            dist.recv(np.zeros(4), src=p, tag=7)


def stop_one(dist, rank: int, size: int, stopped: int) -> list:
    """Every rank learns the others' pids, then ``stopped`` SIGSTOPs itself (a survivor
    continues it in ``finish``); returns the pids."""
    pids = [None] * size
    dist.all_gather_object(pids, os.getpid())
    dist.barrier()
    if rank == stopped:
        os.kill(os.getpid(), signal.SIGSTOP)
    return pids
