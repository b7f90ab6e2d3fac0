"""The call record reaches the flight recorder and NDIST_DEBUG=DETAIL on every
backend: every op is recorded with its dtype and counts (the MPI backend's even
forms included), and DETAIL catches a count mismatch before the backend runs."""

from __future__ import annotations

import pytest

from tests.collectives import recorded
from tests.collectives.collective_launch import launch, unavailable

BACKENDS = ["socket", "mpi"]
pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("detail", [False, True], ids=["plain", "detail"])
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_op_is_recorded_with_dtype_and_counts(backend, n, detail):
    reason = unavailable(backend, n)
    if reason:
        pytest.skip(reason)
    env = {"NDIST_DEBUG": "DETAIL"} if detail else {}
    per_rank = launch(backend, recorded, n, 240, env=env)
    for rank, results in enumerate(per_rank):
        names = [name for name, _ in results]
        assert names[:13] == [name for name, _ in recorded._ops(None, rank, n)]
        for name, got in results:
            assert isinstance(got, dict), f"{backend} rank {rank} {name} failed:\n{got}"
            if name == "p2p":
                assert (got["op"], got["dtype"], got["count_in"]) == ("send" if rank == 0 else "recv", "float64", 3)
                continue
            op, dtype, cin, cout = recorded.expected(name, rank, n)
            assert (got["op"], got["dtype"], got["count_in"], got["count_out"], got["state"]) == \
                (op, dtype, cin, cout, "completed"), f"{backend} rank {rank} {name}"


@pytest.mark.parametrize("backend", BACKENDS, ids=[f"{b}-backend" for b in BACKENDS])  # id "mpi" = pytest-mpi marker
def test_detail_catches_count_mismatches_of_every_form(backend):
    n = 3
    reason = unavailable(backend, n)
    if reason:
        pytest.skip(reason)

    class M:  # launch() runs ``module.entry``
        entry = staticmethod(recorded.mismatch_entry)

    per_rank = launch(backend, M, n, 240, env={"NDIST_DEBUG": "DETAIL"})
    for rank, res in enumerate(per_rank):
        for name, text in res.items():
            assert text.startswith("DistMismatchError: ") and "NDIST_DEBUG=DETAIL" in text, \
                f"{backend} rank {rank} {name}: {text}"
            assert "next all_reduce" not in text, text
