"""A backend that cannot run here fails init_process_group / new_group, saying what to
install, instead of the first collective (torch fails at init too).

mpi4py is installed in the test environment, so each test runs a fresh interpreter in which
a meta-path finder makes ``import mpi4py`` fail, as on a machine without it; ndist itself
is not patched.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.fresh_python import without

HIDE_MPI4PY = without("mpi4py")

_JOB_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "NDIST_STORE", "NDIST_DEBUG")


def _clean_env():
    return {k: v for k, v in os.environ.items()
            if k not in _JOB_VARS and not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_", "SLURM_", "MPI_LOCAL"))}


def _run(body: str) -> subprocess.CompletedProcess:
    code = HIDE_MPI4PY + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], env=_clean_env(), capture_output=True, text=True, timeout=90)


@pytest.mark.timeout(120)
def test_init_mpi_without_mpi4py_fails_at_init_naming_the_extra():
    r = _run("""
        import ndist.distributed as dist
        from ndist.distributed import DistBackendError, HashStore
        for kwargs in (dict(), dict(store=HashStore(), rank=0, world_size=1)):
            try:
                dist.init_process_group("mpi", **kwargs)
            except DistBackendError as e:
                print("ERROR", e)
            else:
                print("NO ERROR at init", kwargs)
            assert not dist.is_initialized()
        # Nothing of the failed init is left behind: another backend still initialises.
        dist.init_process_group("socket", store=HashStore(), rank=0, world_size=1)
        print("SOCKET", dist.get_backend())
        dist.destroy_process_group()
    """)
    assert r.returncode == 0, r.stderr
    errors = [ln for ln in r.stdout.splitlines() if ln.startswith("ERROR")]
    assert len(errors) == 2, r.stdout
    for line in errors:
        assert "backend 'mpi'" in line and "pip install 'ndist[mpi]'" in line and "mpi4py" in line
        assert "registered" not in line  # it was "registered ... not available": say what is missing instead
    assert "SOCKET socket" in r.stdout
    # docs/troubleshooting.md shows this error as printed.
    page = (Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md").read_text()
    assert f"ndist.distributed.DistBackendError: {errors[0][len('ERROR '):]}" in page


@pytest.mark.timeout(120)
def test_new_group_with_mpi_without_mpi4py_fails_when_created():
    r = _run("""
        import ndist.distributed as dist
        from ndist.distributed import DistBackendError, HashStore
        dist.init_process_group("socket", store=HashStore(), rank=0, world_size=1)
        try:
            dist.new_group([0], backend="mpi")
        except DistBackendError as e:
            print("ERROR", e)
        g = dist.new_group([0])  # the group registry is still usable
        t = __import__("numpy").ones(2)
        dist.all_reduce(t, group=g)
        print("AFTER", t.tolist())
        dist.destroy_process_group()
    """)
    assert r.returncode == 0, r.stderr
    assert "ERROR new_group (cpu tensors): backend 'mpi' cannot run" in r.stdout and "pip install 'ndist[mpi]'" in r.stdout, r.stdout
    assert "AFTER [1.0, 1.0]" in r.stdout


@pytest.mark.timeout(120)
def test_under_mpiexec_without_mpi4py_the_rendezvous_names_the_extra():
    import shutil

    local = Path(sys.executable).parent / "mpiexec"
    mpiexec = str(local) if local.exists() else shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("mpiexec not found (pip install mpich)")
    code = HIDE_MPI4PY + "import ndist.distributed as dist\ndist.init_process_group()\n"
    r = subprocess.run([mpiexec, "-n", "1", sys.executable, "-c", code], env=_clean_env(), capture_output=True,
                       text=True, timeout=90)
    assert r.returncode != 0
    assert "pip install 'ndist[mpi]'" in r.stderr and "MASTER_ADDR" in r.stderr, r.stderr
