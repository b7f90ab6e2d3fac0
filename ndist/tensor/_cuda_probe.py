"""Why ``cudaGetDeviceCount`` failed: no GPU at all, or a GPU that cannot be used.

CuPy's runtime API raises ``CUDARuntimeError`` (with a ``status``) when the
device count cannot be read. Most of those errors do not mean "no GPU": a
driver older than the CUDA runtime CuPy was built for (``cupy-cuda13x`` needs
an R580+ driver) reports ``cudaErrorInsufficientDriver`` on a machine full of
GPUs. Reading that as "no GPU" turns a broken set-up into a quiet CPU run, or a
GPU test suite that skips and passes. As torch does, an insufficient-driver
error counts as "no GPU" only when no driver is installed at all
(``cudaDriverGetVersion`` gives 0); with a driver it is a set-up error naming
both versions.

``classify_count_error`` is pure (the caller reads the versions), so every
case is tested without a GPU.
"""

from __future__ import annotations

__all__ = ["classify_count_error", "cuda_version", "NO_DEVICE", "STUB_LIBRARY", "INSUFFICIENT_DRIVER",
           "REQUIRES_NEWER_DRIVER", "SYSTEM_DRIVER_MISMATCH", "COMPAT_NOT_SUPPORTED"]

# cudaError_t values (CUDA runtime API, driver_types.h).
STUB_LIBRARY = 34  # cudaErrorStubLibrary: only the toolkit's stub libcuda.so, no driver
INSUFFICIENT_DRIVER = 35  # cudaErrorInsufficientDriver
REQUIRES_NEWER_DRIVER = 36  # cudaErrorCallRequiresNewerDriver
NO_DEVICE = 100  # cudaErrorNoDevice
SYSTEM_DRIVER_MISMATCH = 803  # cudaErrorSystemDriverMismatch: kernel module and libcuda differ
COMPAT_NOT_SUPPORTED = 804  # cudaErrorCompatNotSupportedOnDevice: forward-compat libcuda on a GPU without it


def cuda_version(code: int) -> str:
    """``12040`` (as cudaDriverGetVersion / cudaRuntimeGetVersion report it) -> ``"12.4"``."""
    return f"{code // 1000}.{(code % 1000) // 10}"


def classify_count_error(exc: BaseException, driver_version: int, runtime_version: int) -> str | None:
    """None when ``exc`` means there is no GPU here; otherwise a message saying what is broken.

    ``driver_version`` is ``cudaDriverGetVersion()`` (0 when no driver is
    installed, or when it could not be read), ``runtime_version`` is
    ``cudaRuntimeGetVersion()`` of the runtime CuPy uses (0 if unknown).
    """
    status = getattr(exc, "status", None)
    if status in (NO_DEVICE, STUB_LIBRARY) or driver_version <= 0:
        return None
    drv, rt = cuda_version(driver_version), cuda_version(runtime_version) if runtime_version > 0 else "unknown"
    versions = f"the NVIDIA driver supports CUDA {drv} (cudaDriverGetVersion {driver_version}), " \
               f"CuPy's CUDA runtime is {rt} (cudaRuntimeGetVersion {runtime_version})"
    if status in (INSUFFICIENT_DRIVER, REQUIRES_NEWER_DRIVER):
        fix = f"install an NVIDIA driver that supports CUDA {rt} or newer"
        if runtime_version >= 13000:
            fix += " (R580 or newer for CUDA 13)"
        major = driver_version // 1000
        fix += f", or the CuPy wheel for the driver's CUDA (cupy-cuda{major}x)"
        return f"the NVIDIA driver is too old for CuPy's CUDA runtime: {versions}; {fix} [{exc}]"
    if status == SYSTEM_DRIVER_MISMATCH:
        return (f"the NVIDIA kernel driver and its user-space library (libcuda) have different versions: "
                f"{versions}; reboot or reinstall the driver so that both match [{exc}]")
    if status == COMPAT_NOT_SUPPORTED:
        return (f"a CUDA forward-compatibility driver is installed for a GPU that does not support it: "
                f"{versions}; remove the cuda-compat libraries from the library path [{exc}]")
    return f"cudaGetDeviceCount failed although an NVIDIA driver is installed: {versions} [{type(exc).__name__}: {exc}]"
