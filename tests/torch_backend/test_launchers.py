"""``init_process_group("ndist", init_method="ndist://")`` under ndistrun, mpiexec (on
the mpi backend) and an srun-style environment: torch's rendezvous through ndist's; and
under ndistrun, torch's default ``env://`` too."""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from tests.torch_backend.torch_helpers import clean_env, run_command  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_launcher_job.py")
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")


def _env(**extra):
    env = {k: v for k, v in clean_env().items() if not k.startswith(("SLURM_", "PMI_", "OMPI_"))}
    return {**env, **extra}


def _run(argv, env, timeout=150):
    rc, out, err = run_command(argv, env, timeout=timeout)
    assert rc == 0, (out + err)[-4000:]
    return out


def _lines(out, n, backend):
    found = sorted(re.findall(r"rank (\d)/(\d) backend (\w+) sum ([\d.]+) objs (\[[\d, ]+\])", out))
    total = n * (n + 1) // 2
    assert found == [(str(r), str(n), backend, str(total), str(list(range(n)))) for r in range(n)], out


@pytest.mark.parametrize("backend", ["socket", "gloo"])
def test_under_ndistrun(backend):
    out = _run([sys.executable, "-m", "ndist.launch", "--nproc-per-node", "2", JOB, backend], _env())
    _lines(out, 2, backend)


@pytest.mark.parametrize("backend", ["socket", "gloo"])
def test_under_ndistrun_with_torchs_default_rendezvous(backend):
    """A torchrun script unchanged (no init_method): its rank 0 hosts torch's store on
    ndistrun's MASTER_PORT, a free port, not ndistrun's own store (EADDRINUSE before)."""
    out = _run([sys.executable, "-m", "ndist.launch", "--nproc-per-node", "2", JOB, backend, "env"], _env())
    _lines(out, 2, backend)


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec")
def test_under_mpiexec_on_the_mpi_backend():
    pytest.importorskip("mpi4py")
    out = _run([MPIEXEC, "-n", "2", sys.executable, JOB, "mpi"], _env())
    _lines(out, 2, "mpi")


def test_in_an_srun_style_environment():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))  # published to the tasks as MASTER_PORT (else derived from SLURM_JOB_ID)
    port = s.getsockname()[1]
    s.close()
    base = _env(SLURM_JOB_ID="4343", SLURM_STEP_ID="0", SLURM_NTASKS="2", SLURM_STEP_NUM_TASKS="2",
                SLURM_JOB_NODELIST="localhost", SLURM_STEP_TASKS_PER_NODE="2", MASTER_PORT=str(port))
    procs = [subprocess.Popen([sys.executable, JOB, "socket"], env=dict(base, SLURM_PROCID=str(r), SLURM_LOCALID=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
             for r in range(2)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=150)
            assert p.returncode == 0, err[-4000:]
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    _lines("".join(outs), 2, "socket")
