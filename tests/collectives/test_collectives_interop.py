"""torch CPU tensors and DLPack producers through the collectives (2 ranks, per backend)."""

from __future__ import annotations

import pytest

from tests.collectives import interop_cases
from tests.collectives.collective_launch import check_case, one_launch

IDS = [fn.__name__ for fn in interop_cases.CASES]


@pytest.mark.timeout(230)
@pytest.mark.parametrize("case_id", IDS)
@pytest.mark.parametrize("backend", [one_launch(f"interop_cases-{b}", b, id=b) for b in ("socket", "mpi")])
@pytest.mark.torch
def test_interop(backend, case_id):
    pytest.importorskip("torch")
    check_case(backend, interop_cases, IDS, case_id)
