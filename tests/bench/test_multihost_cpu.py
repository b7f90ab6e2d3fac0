"""``benchmarks/multihost_cpu.py``: each rank's CPU per call across 2 network namespaces,
ndist (under ndistrun) against MPICH (mpi4py under Hydra, launched into the namespaces).
Checks the shape, never speed: a row per library with its engine and positive times, the
ratio line, and nothing left behind (namespaces, the temp folder).
Needs root, iproute2 and mpi4py with MPICH; skips otherwise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ndist.collectives.backends.socket.native._engine import extension as native_extension
from ndist.testing import namespaces, skip_unless_mpich_hosts

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(150)
def test_cpu_per_call_of_ndist_and_mpich_across_two_namespaces():
    skip_unless_mpich_hosts(pytest.skip)
    before = namespaces()
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "multihost_cpu.py"), "--hosts", "2", "--per-host", "1",
                        "--op", "all_gather", "--sizes", "4K,64K", "--iters", "200", "--rounds", "2", "--timeout", "60"],
                       capture_output=True, text=True, timeout=130)
    if r.returncode != 0 and "cannot create a network namespace" in r.stdout + r.stderr:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("# all_gather, 2 hosts x 1 ranks"), lines[0]
    rows = [ln.split() for ln in lines if ln.split()[1:2] in (["ndist"], ["mpi4py"])]
    engine = "native" if native_extension() is not None else "python"
    assert [(x[0], x[1], x[2]) for x in rows] == [("4096", "ndist", engine), ("4096", "mpi4py", "MPICH"),
                                                 ("65536", "ndist", engine), ("65536", "mpi4py", "MPICH")], r.stdout
    for row in rows:
        wall, cpu, user, system, ivcsw = map(float, row[3:8])
        assert wall > 0 and cpu > 0 and abs(user + system - cpu) < 0.02 + 1e-3 * cpu and ivcsw >= 0, row
    ratios = [ln for ln in lines if "ndist/MPICH: wall" in ln]
    assert [ln.split()[0] for ln in ratios] == ["4096", "65536"], r.stdout
    after = namespaces()
    assert after <= before, after - before  # its namespaces were removed
