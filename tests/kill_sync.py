"""A rank that kills itself right after a barrier leaves only once every rank is past it.

``barrier()`` returns on a rank as soon as it has heard from every other rank; the others
may still be taking in the last messages (a peer that wrote to the victim first may not
have written to them yet). A rank SIGKILLed at that moment is seen by the member watch,
which revokes the group, and a rank still inside the barrier fails there: a
``DistRankFailureError`` naming the dead rank (revocation fails every pending operation),
raised before the job's ``try`` around the operation it means to test. CI saw this once
(``test_a_loss_found_in_one_group_reaches_the_processs_other_groups[tcp]``: rank 3 raised
in the barrier and wrote no record). The same holds for any collective the victim
completes just before it dies.

Every rank marks itself past, in a folder or in the job's store (a key); the victim waits
for every mark before it kills itself (``kill_self``, which notes when). Rank bodies import
this as ``tests.kill_sync`` (the suite's conftest puts the checkout on ``PYTHONPATH`` for
every process it starts)."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta


def all_past(where, rank: int, ranks, victim, timeout: float = 30.0) -> None:
    """Mark ``rank`` as past; on a victim (``victim``: a rank or several), return only once
    every rank in ``ranks`` (an int: ``range(ranks)``) has marked. ``where``: a folder, or a
    store (``set``/``wait``: ndist's or torch's)."""
    ranks = range(ranks) if isinstance(ranks, int) else ranks
    victims = {victim} if isinstance(victim, int) else set(victim)
    if hasattr(where, "wait"):
        where.set(f"kill_sync/past/{rank}", "1")
        if rank in victims:
            where.wait([f"kill_sync/past/{r}" for r in ranks], timedelta(seconds=timeout))
        return
    os.makedirs(where, exist_ok=True)
    with open(os.path.join(where, f"past-{rank}"), "w"):
        pass
    if rank not in victims:
        return
    deadline = time.monotonic() + timeout
    while missing := [r for r in ranks if not os.path.exists(os.path.join(where, f"past-{r}"))]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"ranks {missing} were not past within {timeout} s")
        time.sleep(0.005)


def kill_self(folder) -> None:
    """SIGKILL this rank, first writing the time of its death to ``folder/killed`` (read
    back with ``killed_at``): survivors' records are timed against it."""
    with open(os.path.join(folder, "killed"), "w") as f:
        f.write(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


def killed_at(folder) -> float:
    """When ``kill_self`` killed its rank (``time.time()``)."""
    with open(os.path.join(folder, "killed")) as f:
        return float(f.read())


def run_with_victim(body, n: int, victim, folder, *args, term_timeout: float = 30, timeout: float = 80, **env):
    """``body(rank, n, folder, *args)`` on ``n`` ranks under ndistrun (``env`` added to the
    ranks' environment), of which ``victim`` (a rank or several) kills itself: ndistrun then
    SIGTERMs the survivors and SIGKILLs them ``term_timeout`` seconds later, so a survivor
    that ignores SIGTERM has that long to return its result. The victims' results are None;
    ``.launcher_exitcode`` is ndistrun's exit status."""
    from ndist.testing import run_ranks

    victims = [victim] if isinstance(victim, int) else list(victim)
    return run_ranks(body, n, args=(str(folder), *args), init=False, env=env, launcher="ndistrun",
                     launcher_options=["--term-timeout", f"{term_timeout:g}"], may_die=victims, timeout=timeout)


def step_until_a_peer_dies(step, rank: int, size: int, victim: int, at: int, folder, errors=Exception) -> dict:
    """Call ``step()`` again and again; ``victim`` kills itself (``kill_self``) before its
    step number ``at``. On a survivor, the first error of type ``errors`` becomes the record
    returned (``t``, ``type``, ``peer``, ``host``, ``msg``), once every survivor has its own
    record: a survivor that exits at once resets its connections, and a slower one could
    then see that rank vanish first. Run by the ranks of ``run_with_victim``."""
    survivors = [r for r in range(size) if r != victim]
    for i in range(100000):
        if rank == victim and i == at:
            kill_self(folder)
        try:
            step()
        except errors as err:
            rec = record(err)
            all_past(os.path.join(str(folder), "recorded"), rank, survivors, victim=survivors)
            return rec
    raise AssertionError(f"rank {rank}: no error in 100000 steps, with rank {victim} dead after {at}")


def record(err: BaseException | None = None) -> dict:
    """What a survivor returns about the error it got (None: no error): ``t`` (now,
    ``time.time()``), ``type``, ``peer`` and ``host`` (a ``DistError``'s), ``msg``."""
    if err is None:
        return {"t": time.time(), "type": None}
    return {"t": time.time(), "type": type(err).__name__, "peer": getattr(err, "rank", None),
            "host": getattr(err, "host", None), "msg": str(err)}
