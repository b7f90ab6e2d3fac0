"""A sharing strategy of the shared-memory layer (``ndist.tensor._shm``, which
``ndist.multiprocessing.set_sharing_strategy`` sets) for the time of a test, and the
fixtures built on it (import them into a test module to use them)."""

from __future__ import annotations

import contextlib
import gc

import pytest

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


@pytest.fixture(params=sorted(_shm.get_all_strategies()))
def strategy(request):
    """Each strategy of this system in turn (then a garbage collection: segments the test
    dropped are released)."""
    with strategy_set(request.param):
        yield request.param
    gc.collect()


@pytest.fixture
def file_system():
    """The ``file_system`` strategy (then a garbage collection)."""
    with strategy_set("file_system"):
        yield
    gc.collect()
