"""ndist: distributed computing for Python with PyTorch's API.

``ndist`` mirrors ``torch`` (Tensor, dtypes, devices, factories);
``ndist.distributed``, ``ndist.multiprocessing`` and ``ndist.cuda`` mirror
their torch namesakes, and ``ndistrun`` mirrors ``torchrun``. Importing ndist
imports neither CuPy nor mpi4py: only NumPy and the tensor layer.
"""

from __future__ import annotations

import importlib

from . import tensor as _tensor_pkg
from .tensor import *  # noqa: F403 - the torch-like top level: ndist.tensor(...), ndist.float32, ...

__version__ = "0.1.0"

_SUBMODULES = ("distributed", "multiprocessing", "cuda", "testing", "runtime", "collectives", "launch")

__all__ = list(_tensor_pkg.__all__) + list(_SUBMODULES)


def __getattr__(name: str):
    # ``ndist.distributed`` etc. without importing them at ``import ndist`` time.
    if name in _SUBMODULES:
        return importlib.import_module(f"ndist.{name}")
    raise AttributeError(f"module 'ndist' has no attribute {name!r}")
