"""Sharing strategies for CPU tensors (``torch.multiprocessing`` names).

The strategy decides how ``share_memory_()`` and the reducers place a CPU
tensor in shared memory; the storage itself is ``ndist.tensor._shm``.
"""

from __future__ import annotations

from ...tensor import _shm

__all__ = ["get_all_sharing_strategies", "get_sharing_strategy", "set_sharing_strategy"]


def get_all_sharing_strategies() -> set[str]:
    """Return the set of sharing strategies supported on this system."""
    return _shm.get_all_strategies()


def get_sharing_strategy() -> str:
    """Return the current strategy for sharing CPU tensors."""
    return _shm.get_strategy()


def set_sharing_strategy(new_strategy: str) -> None:
    """Set the strategy for sharing CPU tensors.

    ``new_strategy`` must be one of :func:`get_all_sharing_strategies`;
    otherwise ``ValueError`` lists the valid names. The strategy is per
    process (spawned children start with the default), as in torch.
    """
    _shm.set_strategy(new_strategy)
