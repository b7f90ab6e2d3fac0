"""ndist: distributed computing for Python with PyTorch's API.

``ndist`` mirrors ``torch`` (Tensor, dtypes, devices, factories);
``ndist.distributed``, ``ndist.multiprocessing`` and ``ndist.cuda`` mirror
their torch namesakes, and ``ndistrun`` mirrors ``torchrun``. Importing ndist
imports neither CuPy nor mpi4py: only NumPy and the tensor layer.
"""

from __future__ import annotations

import importlib

_tensor_pkg = importlib.import_module("ndist.tensor")
# The torch-like top level: ndist.float32, ndist.zeros, ndist.int, ndist.max, ...
globals().update({_name: getattr(_tensor_pkg, _name) for _name in _tensor_pkg.PUBLIC})
# ``tensor`` is the package, not the factory function: the package is callable, so
# ``ndist.tensor([1, 2])`` makes a tensor and ``import ndist.tensor._shm as shm`` works.
tensor = _tensor_pkg

__version__ = "0.1.0"

_SUBMODULES = ("distributed", "multiprocessing", "cuda", "testing", "runtime", "collectives", "launch")

# ``from ndist import *`` leaves Python's builtins (int, float, bool, max, sum, ...) alone
# and imports none of the lazy submodules.
__all__ = list(_tensor_pkg.__all__)


def __getattr__(name: str):
    # ``ndist.distributed`` etc. without importing them at ``import ndist`` time.
    if name in _SUBMODULES:
        return importlib.import_module(f"ndist.{name}")
    raise AttributeError(f"module 'ndist' has no attribute {name!r}")
