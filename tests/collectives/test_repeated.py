"""A call repeated with the same buffer objects keeps every check and every
record (repeated_cases), on 2 ranks, per backend."""

from __future__ import annotations

import pytest

from tests.collectives import repeated_cases
from tests.collectives.collective_launch import check_case, one_launch

BACKENDS = ("socket", "mpi")
NAMES = [fn.__name__ for fn in repeated_cases.CASES]


@pytest.mark.timeout(230)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("backend", [one_launch(f"repeated_cases-{b}", b, id=f"{b}-backend") for b in BACKENDS])
def test_repeated_call(backend, name):
    check_case(backend, repeated_cases, NAMES, name)
