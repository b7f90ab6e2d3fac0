"""The nccl backend as process groups create it (rank processes through ndist.testing)."""

from __future__ import annotations

import pytest

from tests.gpu._gpu import require_gpu

cp = require_gpu(nccl=True)

from tests.backend_driver import Driver  # noqa: E402
from ndist.testing import run_ranks  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]


def _in_group(backend, fn):
    """Initialise the default group with ``backend`` (env:// from run_ranks), run ``fn(pg)``."""
    import ndist.collectives  # noqa: F401  (registers the built-in backends)
    from ndist.runtime import destroy_process_group, init_process_group, resolve_group

    init_process_group(backend=backend)
    try:
        return fn(resolve_group(None))
    finally:
        destroy_process_group()


def _default_backends(rank, world_size):
    return _in_group(None, lambda pg: pg.backend_names)


def test_default_backend_on_a_gpu_machine_is_cpu_socket_cuda_nccl():
    assert run_ranks(_default_backends, 1, init=False, timeout=120) == [{"cpu": "socket", "cuda": "nccl"}]


def _nccl_through_the_group(rank, world_size):
    import cupy

    from ndist.collectives import ReduceOp

    def fn(pg):
        be = Driver(pg.backend_for("cuda"))
        x = cupy.arange(6, dtype=cupy.float32)
        be.all_reduce(x, ReduceOp.PREMUL_SUM, scale=2.0).synchronize()
        be.barrier().wait()
        return type(be.backend).__name__, cupy.asnumpy(x).tolist()

    return _in_group("cpu:socket,cuda:nccl", fn)


def test_group_creates_the_nccl_backend_for_cuda_tensors():
    assert run_ranks(_nccl_through_the_group, 1, init=False, timeout=120) == [
        ("NcclBackend", [0.0, 2.0, 4.0, 6.0, 8.0, 10.0])]


def _bound_device(rank, world_size, device):
    import ndist
    import ndist.distributed as dist

    dist.init_process_group("cpu:socket,cuda:nccl", device_id=f"cuda:{device}")
    try:
        x = ndist.ones(4, device=f"cuda:{device}")
        dist.all_reduce(x)
        return dist.group.WORLD.backend_for("cuda")._dev_id, dist.group.WORLD.device_id, float(x.cpu()[0])
    finally:
        dist.destroy_process_group()


def test_device_id_is_the_communicators_device():
    last = cp.cuda.runtime.getDeviceCount() - 1
    assert run_ranks(_bound_device, 1, args=(last,), init=False, timeout=120) == [(last, last, 1.0)]


def _local_rank_default(rank, world_size):
    import ndist
    import ndist.distributed as dist

    dist.init_process_group("cpu:socket,cuda:nccl")
    try:
        x = ndist.ones(4, device="cuda")  # 'cuda' without a device chosen: LOCAL_RANK % device_count()
        dist.all_reduce(x)
        be = dist.group.WORLD.backend_for("cuda")
        return x.device.index, be._dev_id, float(x.cpu()[0])
    finally:
        dist.destroy_process_group()


def test_ranks_on_one_node_get_different_gpus_without_choosing_one():
    n = cp.cuda.runtime.getDeviceCount()
    if n < 2:
        pytest.skip("needs 2 CUDA devices (NCCL refuses two ranks on one GPU), found 1")
    assert run_ranks(_local_rank_default, 2, init=False, timeout=180) == [(0, 0, 2.0), (1, 1, 2.0)]
