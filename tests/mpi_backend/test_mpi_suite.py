"""Run the tests marked ``mpi`` (the MPI backend suites beside this file) under
mpiexec (pytest-mpi) at several world sizes, from the plain pytest run."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: the files of tests marked ``mpi``: they run inside the MPI job
MPI_TESTS = sorted(p for p in Path(__file__).parent.glob("test_*.py")
                   if p.name != Path(__file__).name and "pytest.mark.mpi(" in p.read_text())


def mpiexec() -> str | None:
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else shutil.which("mpiexec")


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it. Hydra's proxies and the ranks each run in
    a session of their own, so a process group would not reach them: the tree is walked."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    todo, tree = [pid], []
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    for p in reversed(tree):  # the ranks first: mpiexec cannot start anything after them
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


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
        _kill_tree(proc.pid)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not end within 400 s (killed, with its proxies and ranks)\n"
                    f"{out[-6000:]}\n{err[-3000:]}")
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}\n{out[-6000:]}\n{err[-3000:]}"
    assert " passed" in out
