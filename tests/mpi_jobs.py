"""mpiexec for the tests that start an MPI job themselves: where it is (beside the
interpreter, else on PATH), and a job of a script file under it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Open MPI's mpiexec refuses to run as root unless told (the GPU machines run as root);
#: MPICH's ignores these
AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def mpiexec() -> str | None:
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else shutil.which("mpiexec")


def script_job(folder, text: str, n: int, timeout: float, env=None) -> subprocess.CompletedProcess:
    """``text`` written to ``folder/job.py`` and run by ``run_script``; skips the test without
    mpiexec or mpi4py."""
    if mpiexec() is None:
        pytest.skip("mpiexec not found")
    pytest.importorskip("mpi4py")
    script = Path(folder) / "job.py"
    script.write_text(text)
    return run_script(script, n, timeout, env)


def run_script(script, n: int, timeout: float, env=None, cwd=None) -> subprocess.CompletedProcess:
    """``mpiexec -n <n> python <script>``, this checkout on ``PYTHONPATH`` (``env`` added),
    its output captured; skips the test without mpiexec."""
    exe = mpiexec()
    if exe is None:
        pytest.skip("mpiexec not found")
    return subprocess.run([exe, "-n", str(n), sys.executable, str(script)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, cwd=cwd)
