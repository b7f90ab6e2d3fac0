"""The GPU suite's own set-up, checked on every machine (no GPU needed).

What the ``cuda`` extra installs, and the reasons the suite gives for skipping
or failing: a missing NCCL library names the package that provides it; a
driver too old for CuPy's CUDA runtime fails the suite with both versions
instead of skipping it as "no GPU".
"""

from __future__ import annotations

import tomllib
import types
from pathlib import Path

import pytest

from tests.gpu import _gpu

ROOT = Path(__file__).resolve().parents[2]


def _extra(name: str) -> list[str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"][name]


def test_cuda_extra_gives_cupy_with_its_toolkit_and_nccl():
    extra = _extra("cuda")
    # cupy-cuda13x alone has no libnccl.so.2 (cupy.cuda.nccl.available is False) and,
    # on a driver-only host, no NVRTC for CuPy's own kernels: [ctk] brings the toolkit.
    assert "cupy-cuda13x[ctk]" in extra
    assert "nvidia-nccl-cu13>=2.27.7,<3" in extra
    assert "cupy-cuda13x" not in extra


def test_nccl_skip_reason_names_the_missing_library_and_the_package():
    reason = _gpu.nccl_missing_reason(types.SimpleNamespace(available=False))
    assert "libnccl.so.2" in reason
    assert "nvidia-nccl-cu13>=2.27.7,<3" in reason
    assert "ndist[cuda]" in reason
    assert "built without" not in reason
    assert _gpu.nccl_missing_reason(types.SimpleNamespace(available=True)) is None
    assert _gpu.nccl_missing_reason(types.SimpleNamespace()) is not None  # no flag: not usable


class CUDARuntimeError(RuntimeError):
    """Shaped like CuPy's: the cudaError_t in ``status``, "name: description" as the message."""

    def __init__(self, status: int, text: str) -> None:
        self.status = status
        super().__init__(text)


def test_old_driver_fails_the_suite_instead_of_skipping_it():
    exc = CUDARuntimeError(35, "cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA "
                               "runtime version")
    outcome, text = _gpu.count_failure_outcome(exc, driver_version=12020, runtime_version=13000)
    assert outcome == "fail"
    assert "12.2" in text and "13.0" in text and "not a missing GPU" in text


def test_no_gpu_skips():
    no_driver = CUDARuntimeError(35, "cudaErrorInsufficientDriver: CUDA driver version is insufficient")
    assert _gpu.count_failure_outcome(no_driver, driver_version=0, runtime_version=13000)[0] == "skip"
    no_device = CUDARuntimeError(100, "cudaErrorNoDevice: no CUDA-capable device is detected")
    outcome, reason = _gpu.count_failure_outcome(no_device, driver_version=13000, runtime_version=13000)
    assert outcome == "skip" and "cudaErrorNoDevice" in reason
