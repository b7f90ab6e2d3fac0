"""Shared set-up of the GPU suite: skip cleanly where there is no CuPy or no GPU."""

from __future__ import annotations

from datetime import timedelta

import pytest


def require_gpu(min_devices: int = 1, nccl: bool = False):
    """Import CuPy or skip the calling module; skip unless ``min_devices`` GPUs (and NCCL) exist."""
    cupy = pytest.importorskip("cupy")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as err:  # noqa: BLE001 - no driver
        pytest.skip(f"no CUDA device ({err})", allow_module_level=True)
    if count < min_devices:
        pytest.skip(f"needs {min_devices} CUDA device(s), found {count}", allow_module_level=True)
    if nccl:
        from cupy.cuda import nccl as _nccl

        if not getattr(_nccl, "available", False):
            pytest.skip("CuPy was built without NCCL", allow_module_level=True)
    return cupy


def device_count() -> int:
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


def single_rank_ctx(name: str, timeout: float = 60.0, options=None):
    from ndist.runtime import BackendContext, HashStore

    return BackendContext(store=HashStore(), rank=0, size=1, timeout=timedelta(seconds=timeout), group_name=name,
                          global_ranks=(0,), device="cuda", options=options)
