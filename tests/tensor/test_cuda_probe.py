"""Classifying a failed cudaGetDeviceCount: no GPU, or a GPU that cannot be used.

The errors are built the way CuPy's runtime API raises them (``CUDARuntimeError``
is a RuntimeError with the cudaError_t in ``status`` and "name: description" as
its message); the versions are what cudaDriverGetVersion / cudaRuntimeGetVersion
report. No GPU needed.
"""

import pytest

from ndist.tensor._cuda_probe import (COMPAT_NOT_SUPPORTED, INSUFFICIENT_DRIVER, NO_DEVICE, STUB_LIBRARY,
                                      SYSTEM_DRIVER_MISMATCH, classify_count_error, cuda_version)


class CUDARuntimeError(RuntimeError):
    def __init__(self, status: int, text: str) -> None:
        self.status = status
        super().__init__(text)


INSUFFICIENT = CUDARuntimeError(INSUFFICIENT_DRIVER, "cudaErrorInsufficientDriver: CUDA driver version is "
                                                     "insufficient for CUDA runtime version")


def test_versions_print_as_major_minor():
    assert (cuda_version(12040), cuda_version(13000), cuda_version(11080)) == ("12.4", "13.0", "11.8")


def test_old_driver_is_a_setup_error_naming_both_versions():
    msg = classify_count_error(INSUFFICIENT, driver_version=12040, runtime_version=13000)
    assert msg is not None
    assert "too old" in msg
    assert "CUDA 12.4" in msg and "12040" in msg and "13.0" in msg and "13000" in msg
    assert "R580" in msg and "cupy-cuda12x" in msg
    assert "cudaErrorInsufficientDriver" in msg


def test_insufficient_driver_without_any_driver_means_no_gpu():
    # No libcuda at all: the runtime reports an insufficient driver and a driver version of 0.
    assert classify_count_error(INSUFFICIENT, driver_version=0, runtime_version=13000) is None


@pytest.mark.parametrize("status,text", [
    (NO_DEVICE, "cudaErrorNoDevice: no CUDA-capable device is detected"),
    (STUB_LIBRARY, "cudaErrorStubLibrary: CUDA driver is a stub library"),
])
def test_no_device_and_stub_library_mean_no_gpu(status, text):
    assert classify_count_error(CUDARuntimeError(status, text), 13000, 13000) is None


@pytest.mark.parametrize("status,words", [
    (SYSTEM_DRIVER_MISMATCH, "kernel driver and its user-space library"),
    (COMPAT_NOT_SUPPORTED, "forward-compatibility"),
    (46, "cudaGetDeviceCount failed although an NVIDIA driver is installed"),  # cudaErrorDevicesUnavailable
])
def test_other_errors_with_a_driver_are_setup_errors(status, words):
    msg = classify_count_error(CUDARuntimeError(status, f"error {status}"), 13000, 13000)
    assert msg is not None and words in msg and "13.0" in msg


def test_an_error_without_status_is_a_setup_error_when_a_driver_exists():
    msg = classify_count_error(RuntimeError("CuPy failed to load libcudart.so.13"), 13000, 0)
    assert msg is not None and "libcudart" in msg and "unknown" in msg
    assert classify_count_error(RuntimeError("CuPy failed to load libcudart.so.13"), 0, 0) is None
