"""Run the tests marked ``mpi`` (the MPI backend suites in tests/collectives/backends) under
mpiexec (pytest-mpi) at several world sizes, from the plain pytest run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MPI_TESTS = sorted((ROOT / "tests" / "collectives" / "backends").glob("test_mpi_*.py"))


def mpiexec() -> str | None:
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else shutil.which("mpiexec")


@pytest.mark.timeout(420)
@pytest.mark.parametrize("nprocs", [4, 1, 3])
def test_mpi_suite(nprocs):
    exe = mpiexec()
    if exe is None:
        pytest.skip("mpiexec not found")
    pytest.importorskip("pytest_mpi")
    cmd = [exe, "-n", str(nprocs), sys.executable, "-m", "pytest", "--with-mpi", "-q", "-p", "no:cacheprovider",
           "-o", "addopts=", "-m", "mpi", *map(str, MPI_TESTS)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    assert " passed" in proc.stdout
