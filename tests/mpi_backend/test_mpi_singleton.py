"""init_process_group("mpi") outside any launcher runs as a one-rank MPI job, as in torch."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("mpi4py")

SCRIPT = """
import ndist, ndist.distributed as dist
dist.init_process_group("mpi")
t = ndist.arange(4)
dist.all_reduce(t)
print(dist.get_backend(), dist.get_rank(), dist.get_world_size(), t.tolist())
dist.destroy_process_group()
"""

_JOB_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NDIST_STORE")


def _clean_env():
    return {k: v for k, v in os.environ.items()
            if k not in _JOB_VARS and not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_", "SLURM_", "MPI_LOCAL"))}


@pytest.mark.timeout(60)
def test_mpi_backend_without_a_launcher_is_a_single_rank_job():
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=_clean_env(), capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["mpi", "0", "1", "[0,", "1,", "2,", "3]"]


@pytest.mark.timeout(60)
def test_socket_backend_without_a_launcher_still_asks_for_the_rendezvous_variables():
    code = "import ndist.distributed as dist; dist.init_process_group('socket')"
    out = subprocess.run([sys.executable, "-c", code], env=_clean_env(), capture_output=True, text=True, timeout=50)
    assert out.returncode != 0
    assert "MASTER_ADDR" in out.stderr or "RANK" in out.stderr
