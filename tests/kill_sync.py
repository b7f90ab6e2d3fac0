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
for every mark before it kills itself. Job scripts import this as ``tests.kill_sync`` (the
suite's conftest puts the checkout on ``PYTHONPATH`` for every process it starts)."""

import os
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
