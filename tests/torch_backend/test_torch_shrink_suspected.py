"""``torch.distributed.shrink_group`` on backend "ndist" keeps a member that a connection
failure made other survivors record as lost, when it is alive and calls ``shrink_group``
too: the torch-side agreement counts as lost only what the torch job's member watch saw go
(``ndist/torch/_watch.py``), never a member a backend merely lost a connection to, as
ndist's own ``shrink_group`` does (the torch twin of
tests/reliability/test_shrink_keeps_suspected.py).

Four ranks over TCP, the test hosts the store (``ndist://``): rank 0 resets its collective
link to rank 1 (a connection failing by itself, as a middlebox's reset would), rank 1's next
collective finds it closed and records rank 0 lost, then rank 3 dies. Every survivor calls
``shrink_group`` with ``[3]``, or with ``ndist.torch.get_failed_ranks()`` (the recipe in
docs/torch.md), which must not name rank 0 on rank 1, and must end in one group of three."""

import pytest

from tests.reliability.shrink_scenarios import check_keeps_suspected, keeps_suspected, run

pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]


@pytest.mark.parametrize("asked", ["3", "get_failed_ranks"])
@pytest.mark.parametrize("engine", ["native", "python"])
def test_a_member_suspected_lost_that_calls_torch_shrink_group_is_kept(engine, asked):
    # (tcp: a same-host group runs on the native engine otherwise, which has no links to reset)
    res = run(keeps_suspected, "torch", 4, asked, victims=[3], transport="tcp", engine=engine, timeout=120)
    check_keeps_suspected(res, "torch")
