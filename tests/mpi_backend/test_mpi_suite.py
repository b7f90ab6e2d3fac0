"""Run the tests marked ``mpi`` (the MPI backend suites beside this file) under
mpiexec (pytest-mpi) at several world sizes, from the plain pytest run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ndist.testing import kill_tree
from tests.mpi_jobs import mpiexec

ROOT = Path(__file__).resolve().parents[2]
#: the files of tests marked ``mpi``: they run inside the MPI job
MPI_TESTS = sorted(p for p in Path(__file__).parent.glob("test_*.py")
                   if p.name != Path(__file__).name and "pytest.mark.mpi(" in p.read_text())


@pytest.mark.timeout(420)
@pytest.mark.parametrize("nprocs", [4, 1, 3])
def test_mpi_suite(nprocs):
    exe = mpiexec()
    if exe is None:
        pytest.skip("mpiexec not found")
    pytest.importorskip("pytest_mpi")
    cmd = [exe, "-n", str(nprocs), sys.executable, "-m", "pytest", "--with-mpi", "-q", "-p", "no:cacheprovider",
           "-o", "addopts=", "-m", "mpi", *map(str, MPI_TESTS)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        out, err = proc.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)  # (Hydra's proxies and ranks run in sessions of their own)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not end within 400 s (killed, with its proxies and ranks)\n"
                    f"{out[-6000:]}\n{err[-3000:]}")
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}\n{out[-6000:]}\n{err[-3000:]}"
    assert " passed" in out
