"""``torch.distributed.shrink_group`` on backend "ndist": a survivor whose default group does
not know yet that a member is lost, with point-to-point operations of that group still
pending on it, finishes the shrink excluding it without waiting for them (issue 29; the torch
twin of tests/reliability/test_shrink_pending_on_excluded.py).

4 ranks, the test hosts the store (``ndist://``). Rank 2's member watch (``ndist/torch/
_watch.py``) is held back: its ``on_loss`` waits until rank 2 calls ``shrink_group``, then
3 s more (as a watch late under load is). Rank 2 posts a ``dist.isend`` and a ``dist.irecv``
with rank 3 on the world, which has no link to rank 3 (rank 3 never publishes its address
there). Rank 3 is SIGKILLed; once the watches of ranks 0 and 1 saw it go, all three call
``shrink_group([3])`` and agree to exclude it. Without the excluded member recorded as lost
in the old group, rank 2's shrink ends by destroying the old group (torch's
``_finalize_shrunk_group``) with both operations pending: the graceful close waits for the
queued send to rank 3 for the whole group timeout (the loss the watch tells once released
no longer reaches a group being closed), and ranks 0 and 1 time out in the shrunk group's
set-up waiting for rank 2. Now the torch shrink records the members it excludes as lost in
the group it shrinks first: what is pending on them fails at once, naming them."""

import pytest

from tests.reliability.shrink_scenarios import check_pending_on_excluded, pending_on_excluded, run

pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]

_TIMEOUT_S = 10.0  # the group timeout: a close that waits on the pending send waits this long
_HOLD_S = 3.0  # rank 2's watch is held back this long after rank 2 began the shrink


@pytest.mark.parametrize("transport,engine", [("tcp", "python"), ("auto", "native")])
def test_a_torch_shrink_does_not_wait_for_operations_pending_on_an_excluded_rank(transport, engine):
    res = run(pending_on_excluded, "torch", 4, _TIMEOUT_S, _HOLD_S, victims=[3], transport=transport, engine=engine)
    check_pending_on_excluded(res, "torch", _TIMEOUT_S)
