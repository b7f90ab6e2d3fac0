"""CuPy arrays through the mpi backend (CUDA-aware MPI, or host staging) and
the mixed-device check. Skips without CuPy, a GPU or mpiexec."""

from __future__ import annotations

import textwrap

import pytest

from tests.mpi_jobs import AS_ROOT, script_job


def _gpu_count():
    from tests.gpu._gpu import gpu_count  # fails the run on a GPU that cannot be used

    return gpu_count()


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_gpu_count() == 0, reason="needs CuPy and a CUDA GPU")]

SCRIPT = textwrap.dedent("""
    import cupy, numpy as np
    import ndist, ndist.distributed as dist

    dist.init_process_group("cpu:mpi,cuda:mpi")
    rank, size = dist.get_rank(), dist.get_world_size()
    a = cupy.full(4, rank + 1, dtype=cupy.float32)
    dist.all_reduce(a)
    assert cupy.asnumpy(a).tolist() == [float(sum(range(1, size + 1)))] * 4
    t = ndist.arange(2 * size, device="cuda") + 10 * rank
    out = ndist.empty(2 * size, dtype=ndist.int64, device="cuda")
    dist.all_to_all_single(out, t)
    want = [10 * r + 2 * rank + k for r in range(size) for k in range(2)]
    assert out.cpu().tolist() == want, out
    outs = [cupy.zeros(r + 1, cupy.float64) for r in range(size)]
    dist.all_gather(outs, cupy.arange(rank + 1, dtype=cupy.float64))
    assert [cupy.asnumpy(o).tolist() for o in outs] == [list(map(float, range(r + 1))) for r in range(size)]
    try:
        dist.all_to_all([np.zeros(1)] * size, [cupy.zeros(1)] * size)
    except RuntimeError as err:
        assert "same device" in str(err) and "cpu" in str(err) and "cuda" in str(err), err
    else:
        raise AssertionError("mixed devices did not raise")
    dist.barrier()
    print("ok", rank, flush=True)
    dist.destroy_process_group()
""")


@pytest.mark.timeout(180)
def test_cupy_arrays_over_mpi(tmp_path):
    proc = script_job(tmp_path, SCRIPT, 2, timeout=150, env=AS_ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("ok ") == 2
