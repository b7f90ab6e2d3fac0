"""Multiprocessing for ndist: tensor sharing (reducers, strategies) and ``spawn``.

The public face is ``ndist.multiprocessing``; this package is its implementation.
Importing it registers the tensor reducers with ``ForkingPickler``.
"""

from ._reductions import init_reductions
from ._spawn import (
    ProcessContext,
    ProcessException,
    ProcessExitedException,
    ProcessRaisedException,
    SpawnContext,
    spawn,
    start_processes,
)
from ._strategy import get_all_sharing_strategies, get_sharing_strategy, set_sharing_strategy

__all__ = [
    "init_reductions",
    "get_all_sharing_strategies",
    "get_sharing_strategy",
    "set_sharing_strategy",
    "spawn",
    "start_processes",
    "ProcessContext",
    "ProcessException",
    "ProcessRaisedException",
    "ProcessExitedException",
    "SpawnContext",
]

init_reductions()
