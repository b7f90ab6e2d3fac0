"""ndist: distributed computing for Python with PyTorch's API.

``ndist`` mirrors ``torch`` (Tensor, dtypes, devices, factories);
``ndist.distributed``, ``ndist.multiprocessing`` and ``ndist.cuda`` mirror
their torch namesakes, and ``ndistrun`` mirrors ``torchrun``. Importing ndist
imports neither CuPy nor mpi4py.

The top level is lazy (PEP 562): the tensor layer (and NumPy) load on the
first access to a tensor name such as ``ndist.float32`` or ``ndist.zeros``,
so ``ndistrun`` itself, which needs neither, starts fast.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_SUBMODULES = ("distributed", "multiprocessing", "cuda", "futures", "testing", "runtime", "collectives", "launch")


def _tensor_pkg():
    # ``tensor`` is the package, and the package is callable: ``ndist.tensor([1, 2])``
    # makes a tensor and ``import ndist.tensor._shm as shm`` works.
    return importlib.import_module("ndist.tensor")


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"ndist.{name}")
    if name == "tensor":
        return _tensor_pkg()
    if name == "__all__":
        # ``from ndist import *`` leaves Python's builtins (int, float, bool, max, sum, ...)
        # alone and imports none of the lazy submodules.
        return list(_tensor_pkg().__all__)
    pkg = _tensor_pkg()
    if name in pkg.PUBLIC:
        value = getattr(pkg, name)
        globals()[name] = value  # resolve once
        return value
    raise AttributeError(f"module 'ndist' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_SUBMODULES) | set(_tensor_pkg().PUBLIC))
