"""torch CPU tensors and DLPack producers through the collectives (2 ranks, per backend)."""

from __future__ import annotations

import functools

import pytest

from tests.collectives import interop_cases
from tests.collectives.collective_launch import launch, unavailable

IDS = [fn.__name__ for fn in interop_cases.CASES]


@functools.lru_cache(maxsize=None)
def _results(backend: str) -> dict:
    try:
        per_rank = launch(backend, interop_cases, 2, 200)
    except BaseException as err:  # noqa: BLE001
        return {i: f"launch failed: {type(err).__name__}: {err}" for i in IDS}
    return {i: "\n".join(f"rank {r}: {res[i]}" for r, res in enumerate(per_rank) if res[i]) or None for i in IDS}


@pytest.mark.timeout(230)
@pytest.mark.parametrize("case_id", IDS)
@pytest.mark.parametrize("backend", ["socket", "mpi"])
@pytest.mark.torch
def test_interop(backend, case_id):
    pytest.importorskip("torch")
    reason = unavailable(backend)
    if reason:
        pytest.skip(reason)
    assert _results(backend)[case_id] is None, _results(backend)[case_id]
