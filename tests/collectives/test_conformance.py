"""Conformance: every collective against a NumPy oracle, once per backend.

Parametrized over backend x world size x dtype x array library. One launch
per (backend, world size) runs every check (``conformance.run_all``) and the
per-(dtype, library) results are reported as separate tests. A new backend is
one entry in ``collective_launch.BACKENDS``.
"""

from __future__ import annotations

import functools

import pytest

from tests.collectives import conformance
from tests.collectives.collective_launch import BACKENDS, launch, one_launch, unavailable

WORLD_SIZES = (1, 2, 3, 4)
#: the socket backend's scheduled algorithms (more than four ranks, or forced):
#: (backend entry, world size, NDIST_ALGO)
SCHEDULED = (("socket", 5, "auto"), ("socket", 8, "auto"), ("socket-shm", 5, "auto"), ("socket-tcp", 8, "auto"),
             ("socket", 3, "sched"))
LAUNCH_TIMEOUT = 240
#: one launch each, whose combos run on one xdist worker (``one_launch``)
LAUNCHES = [one_launch(f"conformance-{b}-{n}", b, n, id=f"{b}-{n}") for b in BACKENDS for n in WORLD_SIZES]
SCHEDULED_LAUNCHES = [one_launch(f"conformance-{b}-{n}-{algo}", b, n, algo, id=f"{b}-{n}-{algo}")
                      for b, n, algo in SCHEDULED]


@functools.lru_cache(maxsize=None)
def _results(name: str, world_size: int, algo: str | None = None) -> dict:
    """Launch once per (backend, world size); a failed launch fails every combo without relaunching."""
    try:
        per_rank = launch(name, conformance, world_size, LAUNCH_TIMEOUT, env={"NDIST_ALGO": algo} if algo else None)
    except BaseException as err:  # noqa: BLE001 - reported by every test of this launch
        text = f"launch failed: {type(err).__name__}: {err}"
        return {combo: text for combo in conformance.combos()}
    merged = {}
    for combo in conformance.combos():
        fails = [f"--- rank {r}:\n{res[combo]}" for r, res in enumerate(per_rank) if res.get(combo)]
        merged[combo] = "\n".join(fails) or None
    return merged


@pytest.mark.timeout(LAUNCH_TIMEOUT + 30)
@pytest.mark.parametrize("combo", conformance.combos())
@pytest.mark.parametrize("backend,world_size", LAUNCHES)
def test_conformance(backend, world_size, combo):
    reason = unavailable(backend, world_size)
    if reason:
        pytest.skip(reason)
    failure = _results(backend, world_size)[combo]
    assert failure is None, f"{backend} on {world_size} ranks, {combo}:\n{failure}"


@pytest.mark.timeout(LAUNCH_TIMEOUT + 30)
@pytest.mark.parametrize("combo", conformance.combos())
@pytest.mark.parametrize("backend,world_size,algo", SCHEDULED_LAUNCHES)
def test_conformance_scheduled(backend, world_size, algo, combo):
    reason = unavailable(backend, world_size)
    if reason:
        pytest.skip(reason)
    failure = _results(backend, world_size, algo)[combo]
    assert failure is None, f"{backend} on {world_size} ranks (NDIST_ALGO={algo}), {combo}:\n{failure}"
