"""``torch.distributed.shrink_group`` on backend "ndist": a group made after a member told
this process it began the shrink of the default group is revoked from the start (issue 29;
the torch twin of tests/reliability/test_group_after_shrink_notice.py, continue kill trial
seed 100118).

3 ranks, the test hosts the store (``ndist://``). Rank 2 is SIGKILLed; rank 0 sees it go
(the torch job's member watch, ``ndist/torch/_watch.py``) and calls ``shrink_group([2])``,
which tells every process. Rank 1 makes ``new_group([0, 1])`` only after that notice came:
its first op raises ``DistRankFailureError`` naming rank 2 at once, where before it waited
the 10 s group timeout for rank 0's address while rank 0's shrink waited for rank 1."""

import pytest

from tests.reliability.shrink_scenarios import check_group_after_notice, group_after_notice, run

pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]


@pytest.mark.parametrize("transport,engine", [("tcp", "python"), ("auto", "native")])
def test_a_torch_group_made_after_a_members_shrink_notice_is_revoked_from_the_start(tmp_path, transport, engine):
    res = run(group_after_notice, "torch", 3, "new_group", str(tmp_path), victims=[2], transport=transport,
              engine=engine)
    check_group_after_notice(res)
