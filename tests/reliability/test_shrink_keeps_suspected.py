"""``shrink_group()`` keeps a member that a connection failure made other survivors record
as lost, when it is alive and calls ``shrink_group`` too: the agreement counts as lost only
what the member watch saw go (the process ended), never a member a backend merely lost a
connection to; and the survivors that recorded it lost connect to it again in the shrunk
group. Found by the ``--on-failure continue`` kill trials (tools/trials/kill_trials.py, seed
20076: a survivor's link to an alive rank closed without a notice, it recorded that rank
lost, and the agreement excluded it although it called shrink_group: it raised ValueError,
the others went on without it).

Four ranks over TCP: rank 0 resets its collective link to rank 1 (a connection failing by
itself, as a middlebox's reset would), rank 1's next collective finds it closed and records
rank 0 lost (and tells ranks 0 and 2), then rank 3 dies. Every survivor must end in one
group of three."""

import pytest

from tests.reliability.shrink_scenarios import check_keeps_suspected, keeps_suspected, run


@pytest.mark.timeout(120)
@pytest.mark.parametrize("engine", ["native", "python"])
def test_a_member_suspected_lost_that_calls_shrink_group_is_kept(engine):
    # (tcp: a same-host group runs on the native engine otherwise, which has no links to reset)
    res = run(keeps_suspected, "ndist", 4, None, victims=[3], transport="tcp", engine=engine)
    check_keeps_suspected(res, "ndist")
