"""Launch ``<module>.entry`` on N ranks of a backend and return every rank's result.

A backend is one ``BackendEntry``; ``ndist.testing.run_ranks`` starts the ranks: its own
processes for the socket backend (and its transports), ``mpiexec`` for mpi.
"""

from __future__ import annotations

import functools
import traceback
from dataclasses import dataclass, field

import numpy as np
import pytest

from ndist.testing import run_ranks
from tests.mpi_jobs import mpiexec


@dataclass(frozen=True)
class BackendEntry:
    """One backend of the suites: its ``init_process_group`` string, how ranks are started,
    extra environment, and the device the tensors live on ("cuda" for a GPU backend such as
    ``BackendEntry("cpu:socket,cuda:nccl", device="cuda")``)."""

    backend: str
    launcher: str = "ranks"  # "ranks": run_ranks' own processes; "mpiexec": an MPI job
    env: dict = field(default_factory=dict)
    device: str = "cpu"


BACKENDS = {
    "socket": BackendEntry("socket"),
    "socket-tcp": BackendEntry("socket", env={"NDIST_TRANSPORT": "tcp"}),
    "socket-shm": BackendEntry("socket", env={"NDIST_TRANSPORT": "shm"}),
    # the native engine over TCP (ctcp.c), forced onto one host's TCP streams
    "socket-native-tcp": BackendEntry("socket", env={"NDIST_TRANSPORT": "tcp", "NDIST_NATIVE_TCP": "1"}),
    # the native engine's two levels (native/_twolevel.py): one host's ranks taken as hosts of 2
    # consecutive ranks (shared memory inside each, TCP between their leaders), every call in two
    # levels (the suite's buffers are below NDIST_NATIVE_TWO_LEVEL_MIN)
    "socket-native-2level": BackendEntry("socket", env={"NDIST_NATIVE_HOSTS": "2", "NDIST_NATIVE_TCP": "auto",
                                                       "NDIST_NATIVE_TWO_LEVEL_MIN": "0"}),
    "mpi": BackendEntry("mpi", launcher="mpiexec"),
    # CUDA tensors: every op on the GPU backend (skips without CuPy and a GPU)
    "nccl": BackendEntry("cpu:socket,cuda:nccl", device="cuda"),
}


def unavailable(name: str, world_size: int = 1) -> str | None:
    """Why backend entry ``name`` cannot run ``world_size`` ranks here, or None."""
    entry = BACKENDS[name]
    import ndist.distributed  # noqa: F401  (registers the built-in backends)
    from ndist.runtime import get_backend_spec

    for name in {part.split(":")[-1] for part in entry.backend.split(",")}:
        try:
            spec = get_backend_spec(name)
        except ValueError:
            return f"backend {name!r} is not registered"
        if not spec.available():
            return f"backend {name!r} is not available here"
    if entry.device == "cuda":
        try:
            import cupy

            if cupy.cuda.runtime.getDeviceCount() < world_size:
                return f"{world_size} ranks need {world_size} CUDA devices (one per rank)"
        except Exception:  # noqa: BLE001 - no CuPy or no driver
            return "CuPy / a CUDA device is not available"
    if entry.launcher == "mpiexec" and mpiexec() is None:
        return "mpiexec not found"
    return None


def one_launch(group: str, *values, id: str | None = None):
    """A ``pytest.param`` of ``values`` for the tests that share one cached launch (``group``
    names it): under ``-n`` all of them run on one xdist worker, which launches the ranks once
    (tests/launch_scheduling.py). Split across the workers, each worker ran the same launch
    for its share of the tests. The parameter must be the one nearest the test function (its
    id comes first in the test's id)."""
    return pytest.param(*values, id=id, marks=pytest.mark.xdist_group(group))


def launch(name: str, module, world_size: int, timeout: float, env: dict | None = None) -> list:
    """Every rank's ``module.entry()`` result, in rank order (``env``: added to the entry's)."""
    entry = BACKENDS[name]
    launcher = "mpiexec" if entry.launcher == "mpiexec" else "spawn"
    return list(run_ranks(module.entry, world_size, args=(entry.device,), backend=entry.backend, timeout=timeout,
                          env={**entry.env, **(env or {})}, launcher=launcher))


@functools.lru_cache(maxsize=None)
def case_results(name: str, module, ids: tuple, world_size: int = 2, timeout: float = 200) -> dict:
    """``{case id: None, or what went wrong on which rank}`` for a cases module whose ``entry``
    returns ``{case id: None or a problem}`` on every rank (one launch per backend and module,
    cached); a launch that fails is every case's problem."""
    try:
        per_rank = launch(name, module, world_size, timeout)
    except BaseException as err:  # noqa: BLE001
        return {i: f"launch failed: {type(err).__name__}: {err}" for i in ids}
    return {i: "\n".join(f"rank {r}: {res[i]}" for r, res in enumerate(per_rank) if res[i]) or None for i in ids}


def check_case(name: str, module, ids, case_id: str) -> None:
    """The test of one case of a cases module on backend entry ``name``: skipped where the
    entry cannot run here, failed with what went wrong on which rank."""
    reason = unavailable(name)
    if reason:
        pytest.skip(reason)
    problem = case_results(name, module, tuple(ids))[case_id]
    assert problem is None, problem


def usable_after(dist, problem: str | None) -> str | None:
    """``problem`` (a case's, or None), with what went wrong in an all_reduce on the same group
    after it: a case must leave the group usable. Run by the cases modules' ranks."""
    rank, size = dist.get_rank(), dist.get_world_size()
    t = np.full(3, float(rank + 1))
    try:
        dist.all_reduce(t)
        if not np.array_equal(t, np.full(3, size * (size + 1) / 2)):
            problem = (problem or "") + f"; the next all_reduce gave {t}"
    except Exception:  # noqa: BLE001
        problem = (problem or "") + f"; the next all_reduce failed:\n{traceback.format_exc()}"
    return problem
