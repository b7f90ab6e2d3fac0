"""ndist.distributed: torch.distributed's API (process groups, stores, collectives, Work).

A facade: the names live in ``ndist.runtime`` (groups, stores, errors, Work)
and ``ndist.collectives`` (collectives, ReduceOp, P2POp).
"""

from .collectives import *  # noqa: F401,F403
from .collectives import __all__ as _collectives_all
from .runtime import *  # noqa: F401,F403
from .runtime import __all__ as _runtime_all

__all__ = sorted(set(_collectives_all) | set(_runtime_all))
