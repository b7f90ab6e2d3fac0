"""A group made after a member told this process it began ``shrink_group`` on the default
group is revoked from the start (issue 29; continue kill trial seed 100118).

That member is in the shrink, which destroys every other group, and never joins the new
group's ops. Before, the notice revoked only the groups that existed when it came: in trial
100118 (n=8, rank 0 killed at the start) rank 5 began the shrink before ranks 4, 6 and 7 had
made subgroup [4, 5, 6, 7]; their first op on it waited the whole group timeout for rank 5's
address, while rank 5's shrink waited for them, and the job split in two.

3 ranks: rank 2 is SIGKILLed; rank 0 sees it go and calls ``shrink_group()``; rank 1 makes
a group with rank 0 only after rank 0's notice came (``new_group`` or ``split_group``), and
its first op on it raises the ``DistRankFailureError`` naming rank 2 at once, not
``DistTimeoutError`` after the 10 s group timeout; then both shrink and carry on."""

import pytest

from tests.reliability.shrink_scenarios import check_group_after_notice, group_after_notice, run


@pytest.mark.timeout(120)
@pytest.mark.parametrize("make", ["new_group", "split_group"])
@pytest.mark.parametrize("transport, engine", [("tcp", "python"), ("auto", "native")])
def test_a_group_made_after_a_members_shrink_notice_is_revoked_from_the_start(tmp_path, make, transport, engine):
    res = run(group_after_notice, "ndist", 3, make, str(tmp_path), victims=[2], transport=transport, engine=engine)
    check_group_after_notice(res)
