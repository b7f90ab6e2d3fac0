"""A survivor whose group does not know yet that a member is lost, with point-to-point
operations of that group still pending on it, finishes ``shrink_group`` excluding it without
waiting for them (issue 29; continue kill trial seed 60174: n=4, shm, Python engine, rank 3
killed right after ``init_process_group``, rank 2 released from a subgroup by another
survivor's shrink notice before its own member watch told it).

4 ranks. Rank 2's member watch is held back (this test holds ``_World.numbering_lock``,
which the watch takes to record a loss, as a watch late under load is). Rank 2 posts an
``isend`` and an ``irecv`` with rank 3 on the world, which has no link to rank 3 (rank 3
never publishes its address there). Rank 3 is SIGKILLed; rank 2 calls
``shrink_group([3])``, ranks 0 and 1 ``shrink_group()`` once their watches saw it go; they
agree to exclude rank 3. Before the fix, rank 2's shrink closed the world gracefully with
both operations pending: the close waited for the queued send to rank 3 for the whole group
timeout (and the loss the watch told once released no longer reached a group being closed),
so ranks 0 and 1 timed out in the shrunk group's set-up waiting for rank 2. Now a shrink
first records the members it excludes as lost in the group it shrinks: what is pending on
them fails at once, naming them."""

import pytest

from tests.reliability.shrink_scenarios import check_pending_on_excluded, pending_on_excluded, run

_TIMEOUT_S = 10.0  # the group timeout: a close that waits on the pending send waits this long
_HOLD_S = 3.0  # rank 2's watch is held back this long after rank 2 learnt of the loss


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport,engine", [("tcp", "python"), ("auto", "native")])
def test_a_shrink_does_not_wait_for_operations_pending_on_an_excluded_rank(transport, engine):
    res = run(pending_on_excluded, "ndist", 4, _TIMEOUT_S, _HOLD_S, victims=[3], transport=transport, engine=engine)
    check_pending_on_excluded(res, "ndist", _TIMEOUT_S)
