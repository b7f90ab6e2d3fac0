"""Conformance: every collective against a NumPy oracle, once per backend.

Parametrized over backend x world size x dtype x array library. One launch
per (backend, world size) runs every check (``conformance.run_all``) and the
per-(dtype, library) results are reported as separate tests. A new backend is
one entry in ``BACKENDS``.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import conformance

HERE = Path(__file__).resolve().parent
WORLD_SIZES = (1, 2, 3, 4)
LAUNCH_TIMEOUT = 240


@dataclass(frozen=True)
class BackendEntry:
    backend: str
    launcher: str = "ranks"  # "ranks": ndist.testing.run_ranks; "mpiexec": an MPI job
    env: dict = field(default_factory=dict)


BACKENDS = {
    "socket": BackendEntry("socket"),
    "socket-tcp": BackendEntry("socket", env={"NDIST_TRANSPORT": "tcp"}),
    "socket-shm": BackendEntry("socket", env={"NDIST_TRANSPORT": "shm"}),
    "mpi": BackendEntry("mpi", launcher="mpiexec"),
}


def mpiexec() -> str | None:
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else shutil.which("mpiexec")


def _available(entry: BackendEntry) -> str | None:
    from ndist.runtime import get_backend_spec

    try:
        spec = get_backend_spec(entry.backend)
    except ValueError:
        return f"backend {entry.backend!r} is not registered"
    if not spec.available():
        return f"backend {entry.backend!r} is not available here"
    if entry.launcher == "mpiexec" and mpiexec() is None:
        return "mpiexec not found"
    return None


def _merge(per_rank: list) -> dict:
    merged = {}
    for combo in conformance.combos():
        fails = [f"--- rank {r}:\n{res[combo]}" for r, res in enumerate(per_rank) if res.get(combo)]
        merged[combo] = "\n".join(fails) or None
    return merged


@functools.lru_cache(maxsize=None)
def _results(name: str, world_size: int) -> dict:
    """Launch once per (backend, world size); a failed launch fails every combo (without relaunching)."""
    try:
        return _launch(name, world_size)
    except BaseException as err:  # noqa: BLE001 - reported by every test of this launch
        text = f"launch failed: {type(err).__name__}: {err}"
        return {combo: text for combo in conformance.combos()}


def _launch(name: str, world_size: int) -> dict:
    entry = BACKENDS[name]
    env = {**os.environ, **entry.env}
    if entry.launcher == "mpiexec":
        out = Path(os.environ.get("TMPDIR", "/tmp")) / f"ndist-conf-{os.getpid()}-{name}-{world_size}.json"
        cmd = [mpiexec(), "-n", str(world_size), sys.executable, str(HERE / "_mpi_conformance.py"), str(out)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT)
        if proc.returncode != 0 or not out.exists():
            raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-4000:]}\n"
                                 f"{proc.stderr[-4000:]}")
        per_rank = json.loads(out.read_text())
        out.unlink()
        return _merge(per_rank)
    from ndist.testing import run_ranks

    saved = {k: os.environ.get(k) for k in entry.env}
    os.environ.update(entry.env)
    try:
        per_rank = run_ranks(conformance.entry, world_size, backend=entry.backend, timeout=LAUNCH_TIMEOUT)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return _merge(list(per_rank))


@pytest.mark.timeout(LAUNCH_TIMEOUT + 30)
@pytest.mark.parametrize("combo", conformance.combos())
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_conformance(backend, world_size, combo):
    reason = _available(BACKENDS[backend])
    if reason:
        pytest.skip(reason)
    failure = _results(backend, world_size)[combo]
    assert failure is None, f"{backend} on {world_size} ranks, {combo}:\n{failure}"
