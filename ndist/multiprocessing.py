"""ndist.multiprocessing: a drop-in replacement for the stdlib ``multiprocessing``
(like ``torch.multiprocessing``).

Every public name of ``multiprocessing`` is here. On top of it, importing this
module registers reducers so that an ``ndist.Tensor`` sent through a Queue, a
Pipe or a Process's arguments, in any context (``get_context("spawn" |
"fork" | "forkserver")``), moves to shared memory and arrives without a copy:
an in-place change in the receiver is visible to the sender. CUDA tensors are
shared through CUDA IPC; the producer must keep them alive while consumers use
them.

Sharing strategies for CPU tensors: ``get_all_sharing_strategies()``,
``get_sharing_strategy()``, ``set_sharing_strategy(name)``
(``file_descriptor``, the Linux default, or ``file_system``).

``spawn(fn, args, nprocs)`` / ``start_processes`` run ``fn(i, *args)`` in child
processes and re-raise a child's failure as ``ProcessRaisedException`` /
``ProcessExitedException``.
"""

import multiprocessing
from multiprocessing import *  # noqa: F401,F403  (the drop-in part)

from .runtime.multiprocessing import (
    ProcessContext,
    ProcessException,
    ProcessExitedException,
    ProcessRaisedException,
    SpawnContext,
    get_all_sharing_strategies,
    get_sharing_strategy,
    set_sharing_strategy,
    spawn,
    start_processes,
)

from .runtime.multiprocessing import __all__ as _ndist_names

# ndist's additions (the reducers are registered by importing them), then the stdlib's names.
__all__ = [n for n in _ndist_names if n != "init_reductions"] + list(multiprocessing.__all__)
