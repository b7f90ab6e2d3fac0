"""init_process_group(device_id=...) and the launcher's local rank reach the CUDA device choice.

The choice itself is tests/tensor/test_cuda_device_choice.py; the nccl backend
using the result (BackendContext.device_index) needs a GPU: tests/gpu.
"""

import types

import pytest

from tests.runtime import _runtime_store_backend  # noqa: F401 - registers the "storetest" backend
import ndist
from ndist.runtime import HashStore
from ndist.runtime._device import backend_device_index, parse_device_id
from ndist.tensor import _cuda


@pytest.mark.parametrize("value,expected", [
    (None, None), (3, 3), ("cuda:1", 1), (ndist.device("cuda", 2), 2), (ndist.device("cpu"), None), ("cpu", None),
    (types.SimpleNamespace(type="cuda", index=1), 1),  # a torch.device
])
def test_device_id_forms(value, expected):
    assert parse_device_id(value) == expected


@pytest.mark.parametrize("value,exc,pattern", [
    ("cuda", ValueError, r"device_id: expected a CUDA device with an index such as 'cuda:0', got 'cuda'"),
    (-1, ValueError, "device_id: expected a CUDA ordinal >= 0, got -1"),
    (True, TypeError, "device_id: expected an int, 'cuda:N' or a device, got True"),
    (1.5, TypeError, "device_id: expected an int, 'cuda:N' or a device, got float"),
    ("gpu:0", ValueError, "device_id"),
])
def test_bad_device_id(value, exc, pattern):
    with pytest.raises(exc, match=pattern):
        parse_device_id(value)


@pytest.fixture
def clean_launch_state():
    saved = list(_cuda._launch_local_rank)
    yield
    _cuda._launch_local_rank[:] = saved


def test_device_id_is_bound_to_the_world_and_its_subgroups(monkeypatch, clean_launch_state):
    import ndist.distributed as dist

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    dist.init_process_group("storetest", store=HashStore(timeout=5), rank=0, world_size=1, device_id="cuda:1")
    try:
        assert dist.group.WORLD.device_id == 1
        assert dist.new_group([0]).device_id == 1
    finally:
        dist.destroy_process_group()


def test_bad_device_id_fails_before_the_rendezvous():
    import ndist.distributed as dist

    with pytest.raises(ValueError, match="device_id: expected a CUDA device with an index"):
        dist.init_process_group("storetest", store=HashStore(timeout=5), rank=0, world_size=1, device_id="cuda")
    assert not dist.is_initialized()


@pytest.mark.parametrize("env,local_rank", [
    ({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}, 1),  # ndistrun / torchrun
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "3"}, 3),  # mpiexec
    ({"SLURM_PROCID": "2", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "2"}, 2),  # srun
    ({}, None),  # not launched
])
def test_the_launchers_local_rank_reaches_the_cuda_default(monkeypatch, clean_launch_state, env, local_rank):
    import ndist.distributed as dist

    from ndist.runtime import _env

    for name in list(__import__("os").environ):
        if name in ("RANK", "WORLD_SIZE", "LOCAL_RANK") or name.startswith(("OMPI_", "PMI_", "PMIX_", "SLURM_")):
            monkeypatch.delenv(name)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert _env.detect().local_rank == local_rank
    dist.init_process_group("storetest", store=HashStore(timeout=5), rank=0, world_size=1)
    try:
        assert _cuda._launch_local_rank == ([] if local_rank is None else [local_rank])
    finally:
        dist.destroy_process_group()


def test_no_gpu_leaves_the_choice_to_the_backend():
    if ndist.cuda.is_available():
        pytest.skip("a GPU is available here")
    assert backend_device_index(None) is None and backend_device_index(1) is None
