"""The ``nccl`` backend: collectives on CUDA (CuPy) arrays through NCCL.

Uses CuPy's maintained binding (``cupy.cuda.nccl``), imported only when a
backend is created or availability is probed, so ``import ndist`` never loads
CuPy. See ``_backend.py`` for the semantics and ``docs/gpu.md`` for testing.
"""

from __future__ import annotations

import importlib.util
import logging

__all__ = ["create", "is_available"]

log = logging.getLogger("ndist.collectives.nccl")


def is_available() -> bool:
    """True if CuPy with NCCL support is installed and at least one CUDA device is visible."""
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy
        from cupy.cuda import nccl
    except Exception:  # noqa: BLE001 - a broken CUDA install means "not available"
        log.debug("cupy / cupy.cuda.nccl failed to import", exc_info=True)
        return False
    if not getattr(nccl, "available", False):
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no driver / no device
        log.debug("no CUDA device", exc_info=True)
        return False


def create(ctx):
    """Backend factory registered as ``nccl`` (devices: cuda)."""
    from ._backend import NcclBackend

    return NcclBackend(ctx)
