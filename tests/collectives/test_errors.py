"""Every bad call of error_cases raises the documented error before sending
anything, and the group stays usable (on 2 ranks, per backend)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.collectives import error_cases
from tests.collectives.collective_launch import check_case, one_launch

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors.md"
BACKENDS = ("socket", "mpi")
IDS = [case[0] for case in error_cases.CASES]


def test_there_are_at_least_30_cases():
    assert len(set(IDS)) == len(IDS) >= 30


@pytest.mark.parametrize("case_id", IDS)
def test_documented(case_id):
    assert re.search(rf"`{re.escape(case_id)}`", DOC.read_text()), f"{case_id} missing from docs/errors.md"


@pytest.mark.timeout(230)
@pytest.mark.parametrize("case_id", IDS)
@pytest.mark.parametrize("backend", [one_launch(f"error_cases-{b}", b, id=b) for b in BACKENDS])
def test_bad_call(backend, case_id):
    check_case(backend, error_cases, IDS, case_id)
