"""A survivor that begins ``shrink_group`` on the default group tells every other process,
and revokes its other groups, when any of its groups knows a loss, not only when the
default group's own record holds it (issue 29; continue kill trial seed 40000, trial 0).

4 ranks, subgroups [0, 1] and [1, 2, 3], no collective on the world before the loss.
Rank 0 waits in the first op of [0, 1] (its set-up waits for rank 1's address); rank 2
is SIGKILLed; ranks 1 and 3 learn of it in [1, 2, 3] and call ``shrink_group()``. On
rank 1 the member watch has not told the loss yet (its thread is held back, as it was
under load in the trial: this test holds ``_World.numbering_lock``, which the watch's
thread takes to record a loss, for 3 s after rank 1 learnt of the loss), so only the
subgroup knows it. Before the fix rank 1's ``begin_default_shrink`` found the default
group's record empty and told nobody: rank 0 was never released (rank 3's notice does
not concern [0, 1]) and raised ``DistTimeoutError`` after the group timeout, by when
ranks 1 and 3 had timed out their agreement waiting for it. Now rank 1 tells at once:
rank 0's op raises ``DistRankFailureError`` naming rank 2, and the three finish."""

import pytest

from tests.reliability.shrink_scenarios import check_told_by_any_group, run, told_by_any_group

_HOLD_S = 3.0  # rank 1's watch is held back this long after rank 1 learnt of the loss (the group timeout: 10 s)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport,engine", [("tcp", "python"), ("auto", "native")])
def test_a_shrink_begun_on_a_loss_only_a_subgroup_knows_tells_the_others(transport, engine):
    res = run(told_by_any_group, "ndist", 4, _HOLD_S, victims=[2], transport=transport, engine=engine)
    check_told_by_any_group(res, _HOLD_S)
