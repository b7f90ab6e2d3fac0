"""``torch.distributed.shrink_group`` on backend "ndist" when things go wrong around it
(issue 29); 4 ranks, the test hosts the store (``ndist://``), global rank 3 SIGKILLs itself.

* A rank lost while the survivors are inside the shrink: the survivors finish on the group
  without it (the agreement repeats, or a survivor that learns of it on the shrunk group
  shrinks that one), never hang. The torch twin of
  ``test_a_loss_during_the_shrink_makes_the_agreement_repeat`` (tests/reliability/
  test_rank_loss.py): rank 2 dies inside the agreement, once it posted what it saw (at its
  first pause), or as it adopts the decision.
* A survivor blocked in a healthy subgroup ([0, 1]) on a member that went into the shrink of
  the default group instead is released at once and shrinks too (the torch twin of
  tests/reliability/test_shrink_blocked_subgroup.py)."""

import pytest

from tests.reliability.shrink_scenarios import (blocked_subgroup, check_blocked_subgroup, check_lost_during_shrink,
                                                lost_during_shrink, run)

pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]


@pytest.mark.parametrize("when", ["pause", "adopt"])
def test_a_rank_lost_inside_torch_shrink_group_the_survivors_finish(when):
    res = run(lost_during_shrink, "torch", 4, when, victims=[2, 3], timeout=120)
    check_lost_during_shrink(res, "torch")


def test_a_survivor_blocked_in_a_healthy_subgroup_is_released_by_torchs_shrink(tmp_path):
    res = run(blocked_subgroup, "torch", 4, "first", str(tmp_path), victims=[3], timeout=120)
    check_blocked_subgroup(res, "torch")
