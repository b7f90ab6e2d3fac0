"""A survivor blocked in a *healthy* group on a member that went into ``shrink_group`` on the
default group is released at once (issue 29).

4 ranks, subgroup [0, 1], rank 3 SIGKILLed. Ranks 0 and 2 raise ``DistRankFailureError`` on
the world and call ``shrink_group()``; rank 1 waits in an op on [0, 1] that rank 0 never
joins (the shrink destroys every other group, as torch's does). Before the fix rank 1
waited its op's timeout and ranks 0 and 2 raised ``DistTimeoutError: shrink_group ...
ranks (global) [1] neither called shrink_group nor were found lost``. Now a survivor that
begins the shrink revokes its other groups and tells every process through the member
watch: rank 1's op fails with a ``DistRankFailureError`` naming rank 3 (``failed_ranks``
[]: no member of [0, 1] is lost), rank 1 shrinks too, and the three survivors finish.

Cases: the op is the subgroup's first (no link to rank 0 yet: it waits for rank 0's
address), or the subgroup has links (an op ran on it before), or rank 1 waits in a
``recv`` from rank 0; both engines."""

import pytest

from tests.reliability.shrink_scenarios import blocked_subgroup, check_blocked_subgroup, run


@pytest.mark.timeout(120)
@pytest.mark.parametrize("engine,how", [("native", "first"), ("native", "linked"), ("python", "first"),
                                        ("python", "linked"), ("python", "recv")])
def test_a_survivor_blocked_in_a_healthy_subgroup_is_released_by_the_shrink(tmp_path, engine, how):
    res = run(blocked_subgroup, "ndist", 4, how, str(tmp_path), victims=[3], engine=engine)
    check_blocked_subgroup(res, "ndist")
