"""init_process_group() in processes that look like the tasks of an srun job step."""

import os
import socket
import subprocess
import sys

import pytest

STRIP = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "NDIST_STORE")


@pytest.mark.timeout(120)
def test_srun_style_environment():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))  # published to the tasks as MASTER_PORT (else derived from SLURM_JOB_ID)
    port = s.getsockname()[1]
    s.close()
    base = {k: v for k, v in os.environ.items() if k not in STRIP and not k.startswith(("SLURM_", "PMI_", "OMPI_"))}
    base.update(SLURM_JOB_ID="4242", SLURM_STEP_ID="0", SLURM_NTASKS="4", SLURM_STEP_NUM_TASKS="4",
                SLURM_JOB_NODELIST="localhost", SLURM_STEP_TASKS_PER_NODE="2(x2)", MASTER_PORT=str(port),
                NDIST_SECRET="slurm-test")
    procs = [
        subprocess.Popen([sys.executable, "-m", "tests.runtime._slurm_init_script"],
                         env=dict(base, SLURM_PROCID=str(r), SLURM_LOCALID=str(r % 2)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(4)
    ]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=90)
            assert p.returncode == 0, err
            outs.append(out.strip())
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert outs == [f"rank {r}/4 sum 4 sub {[0, 1] if r < 2 else [2, 3]}" for r in range(4)]
