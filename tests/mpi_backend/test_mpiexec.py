"""init_process_group() under a plain ``mpiexec -n N python script.py``."""

import os
import re
import shutil
import subprocess
import sys

import pytest

import ndist.collectives  # noqa: F401  registers the built-in backends
from ndist.runtime import registered_backends

MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")

# Not marked "mpi": pytest-mpi would skip it outside mpiexec; this test starts mpiexec itself.
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec")


def _mpiexec(n, backend):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "NDIST_STORE", "NDIST_SECRET")}
    proc = subprocess.run(
        [MPIEXEC, "-n", str(n), sys.executable, "-m", "tests.mpi_backend._mpi_init_script", backend],
        env=env, capture_output=True, text=True, timeout=150,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # mpiexec may forward the ranks' lines interleaved (one without its newline): match fields exactly
    lines = sorted(re.findall(r"rank (\d+)/(\d+) backend ([a-z]+) sum ([\d.]+) pair ([\d.]+)", proc.stdout))
    assert len(lines) == n, proc.stdout + proc.stderr
    return lines


@pytest.mark.timeout(180)
@pytest.mark.parametrize("n", [2, 4])
def test_mpiexec_rendezvous_through_mpi_broadcast(n):
    lines = _mpiexec(n, "storetest")
    total = n * (n + 1) // 2
    for r, (rank, size, backend, s, pair) in enumerate(lines):
        assert (int(rank), int(size), backend, float(s)) == (r, n, "storetest", total)
        assert float(pair) == (2.0 if r < 2 else 1.0)


@pytest.mark.timeout(180)
@pytest.mark.skipif("mpi" not in registered_backends(), reason="mpi backend not registered in this checkout")
def test_mpiexec_default_backend_is_mpi():
    lines = _mpiexec(4, "default")
    assert [(int(r), b, float(s)) for r, _, b, s, _ in lines] == [(r, "mpi", 10.0) for r in range(4)]
