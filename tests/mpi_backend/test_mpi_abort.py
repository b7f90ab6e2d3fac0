"""An unhandled exception on one MPI rank aborts the job instead of deadlocking it."""

from __future__ import annotations

import textwrap
import time

import pytest

from tests.mpi_jobs import script_job

SCRIPT = textwrap.dedent("""
    import numpy as np
    import ndist.distributed as dist

    dist.init_process_group("mpi")
    t = np.ones(1)
    dist.all_reduce(t)                      # the mpi backend is up on every rank
    if dist.get_rank() == 1:
        raise RuntimeError("rank 1 fails on purpose")
    dist.barrier()                          # rank 0 would wait here forever without the abort
    print("rank 0 passed the barrier", flush=True)
""")


@pytest.mark.timeout(90)
def test_unhandled_exception_aborts_every_rank(tmp_path):
    from ndist.bench._launch import (hydra_files, hydra_files_left, mpich_segments, remove_orphan_hydra_files,
                                    remove_orphan_mpich_segments)

    segments, topology = mpich_segments(), hydra_files()
    start = time.monotonic()
    try:
        proc = script_job(tmp_path, SCRIPT, 2, timeout=60)
    finally:  # an aborted MPICH job leaves its segment in /dev/shm (unlinked at MPI_Finalize), and
        # its mpiexec its topology file in /tmp
        remove_orphan_mpich_segments(segments)
        remove_orphan_hydra_files(topology)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert "rank 1 fails on purpose" in proc.stderr
    assert "passed the barrier" not in proc.stdout
    assert elapsed < 45, f"the job took {elapsed:.1f} s to end"
    left = hydra_files_left(topology)
    assert not left, f"the aborted job's topology file is still there: {left}"
