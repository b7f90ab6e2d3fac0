"""A call repeated with the same buffer objects keeps every check and every
record (repeated_cases), on 2 ranks, per backend."""

from __future__ import annotations

import functools

import pytest

from tests.collectives import repeated_cases
from tests.collectives.collective_launch import launch, unavailable

BACKENDS = ("socket", "mpi")
NAMES = [fn.__name__ for fn in repeated_cases.CASES]


@functools.lru_cache(maxsize=None)
def _results(backend: str) -> dict:
    try:
        per_rank = launch(backend, repeated_cases, 2, 200)
    except BaseException as err:  # noqa: BLE001
        return {name: f"launch failed: {type(err).__name__}: {err}" for name in NAMES}
    return {name: "\n".join(f"rank {r}: {res[name]}" for r, res in enumerate(per_rank) if res[name]) or None
            for name in NAMES}


@pytest.mark.timeout(230)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("backend", BACKENDS, ids=[f"{b}-backend" for b in BACKENDS])
def test_repeated_call(backend, name):
    reason = unavailable(backend)
    if reason:
        pytest.skip(reason)
    assert _results(backend)[name] is None, _results(backend)[name]
