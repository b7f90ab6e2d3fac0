"""``torch.distributed.shrink_group`` on the default group of backend "ndist": a survivor
that begins it tells every other process, and revokes its other groups, when any of its
groups knows a loss, not only when the default group's own record holds it (issue 29; the
torch twin of tests/reliability/test_shrink_told_by_any_group.py).

4 ranks, the test hosts the store (``ndist://``), subgroups [0, 1] and [1, 2, 3], no
collective on the world before the loss. Rank 0 waits in the first op of [0, 1] (its set-up
waits for rank 1's address); rank 2 is SIGKILLed; ranks 1 and 3 learn of it in [1, 2, 3] and
call ``shrink_group([2])``. On rank 1 neither the torch job's member watch
(``ndist/torch/_watch.py``) nor the subgroup's socket backend has told the default group yet
(every torch group's backend exists from its creation, and a backend that finds a loss tells
the process's other groups, ``GroupFailure``'s spread, after failing its own waiters): both
are held back for 3 s after rank 1 learnt of the loss (as a loaded machine may hold them), so
only the subgroup knows it. Before
the fix rank 1's ``begin_default_shrink`` found the default group's record empty and told
nobody: rank 0 was never released (rank 3's notice does not concern [0, 1]) and waited out
the group timeout. Now rank 1 tells at once: rank 0's op raises ``DistRankFailureError``
naming rank 2, and the three finish on a group of three."""

import pytest

from tests.reliability.shrink_scenarios import check_told_by_any_group, run, told_by_any_group

pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]

_HOLD_S = 3.0  # rank 1's watch is held back this long after rank 1 learnt of the loss


@pytest.mark.parametrize("transport,engine", [("tcp", "python"), ("auto", "native")])
def test_a_torch_shrink_begun_on_a_loss_only_a_subgroup_knows_tells_the_others(transport, engine):
    res = run(told_by_any_group, "torch", 4, _HOLD_S, victims=[2], transport=transport, engine=engine)
    check_told_by_any_group(res, _HOLD_S)
