"""Shared set-up of the GPU suite: skip only where there truly is no GPU.

* No CuPy, or no GPU (no driver, or ``cudaErrorNoDevice``): the modules skip.
* A GPU that cannot be used (a driver too old for CuPy's CUDA runtime, a
  kernel/user-space driver mismatch, ...): the suite *fails* at collection,
  naming the versions (``ndist.tensor._cuda_probe``), instead of skipping and
  passing.
* NCCL missing: the NCCL modules skip, saying which package provides it.
"""

from __future__ import annotations

import importlib.util
from datetime import timedelta

import pytest

NCCL_REQUIREMENT = "nvidia-nccl-cu13>=2.27.7,<3"


def count_failure_outcome(exc: BaseException, driver_version: int, runtime_version: int) -> tuple[str, str]:
    """``("skip", reason)`` when ``exc`` from cudaGetDeviceCount means no GPU, else ``("fail", message)``."""
    from ndist.tensor._cuda_probe import classify_count_error

    broken = classify_count_error(exc, driver_version, runtime_version)
    if broken is None:
        return "skip", f"no CUDA device ({exc})"
    return "fail", f"GPU set-up error, not a missing GPU: {broken}"


def gpu_count() -> int:
    """GPUs visible to CuPy; 0 without CuPy or without a GPU. Fails the run on a broken set-up."""
    if importlib.util.find_spec("cupy") is None:
        return 0
    import cupy

    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # noqa: BLE001 - classified below
        from ndist.tensor._cuda import _version

        rt = cupy.cuda.runtime
        outcome, text = count_failure_outcome(exc, _version(rt.driverGetVersion), _version(rt.runtimeGetVersion))
        if outcome == "fail":
            pytest.fail(text, pytrace=False)
        return 0


def nccl_missing_reason(nccl) -> str | None:
    """Why ``cupy.cuda.nccl`` (the module, or anything with ``available``) cannot be used; None if it can."""
    if getattr(nccl, "available", False):
        return None
    return (f"NCCL is not installed: cupy.cuda.nccl.available is False because CuPy found no libnccl.so.2; "
            f"install it with pip install '{NCCL_REQUIREMENT}' (or pip install 'ndist[cuda]')")


def require_gpu(min_devices: int = 1, nccl: bool = False):
    """Import CuPy or skip the calling module; skip unless ``min_devices`` GPUs (and NCCL) exist."""
    cupy = pytest.importorskip("cupy")
    count = gpu_count()
    if count == 0:
        pytest.skip("no CUDA device", allow_module_level=True)
    if count < min_devices:
        pytest.skip(f"needs {min_devices} CUDA device(s), found {count}", allow_module_level=True)
    if nccl:
        from cupy.cuda import nccl as _nccl

        reason = nccl_missing_reason(_nccl)
        if reason is not None:
            pytest.skip(reason, allow_module_level=True)
    return cupy


def device_count() -> int:
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


def single_rank_ctx(name: str, timeout: float = 60.0, options=None):
    from ndist.runtime import BackendContext, HashStore

    return BackendContext(store=HashStore(), rank=0, size=1, timeout=timedelta(seconds=timeout), group_name=name,
                          global_ranks=(0,), device="cuda", options=options)


def single_rank_nccl(name: str, options=None):
    """The nccl backend of a one-rank group named ``name`` (a ``Driver``)."""
    from ndist.runtime import get_backend_spec
    from tests.backend_driver import Driver

    return Driver(get_backend_spec("nccl").create(single_rank_ctx(name, options=options)))


def nccl_fixture(name: str, scope: str = "function"):
    """A fixture (assign it to a module-level name) that gives ``single_rank_nccl(name)`` and
    closes it after."""

    @pytest.fixture(scope=scope)
    def fixture():
        backend = single_rank_nccl(name)
        yield backend
        backend.close()

    return fixture
