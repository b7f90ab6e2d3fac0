"""A sharing strategy of the shared-memory layer (``ndist.tensor._shm``, which
``ndist.multiprocessing.set_sharing_strategy`` sets) for the time of a test."""

from __future__ import annotations

import contextlib

from ndist.tensor import _shm


@contextlib.contextmanager
def strategy_set(name: str):
    """``name`` is this process's sharing strategy inside the block, the one before after it."""
    old = _shm.get_strategy()
    _shm.set_strategy(name)
    try:
        yield name
    finally:
        _shm.set_strategy(old)
