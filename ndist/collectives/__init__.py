"""ndist.collectives: public collective functions, argument checking, ReduceOp,
the Backend interface and the backends (socket, mpi, nccl)."""

from . import backends  # noqa: F401  (registers the built-in backends)
from ._backend import Backend
from ._reduce_op import ReduceOp

__all__ = ["Backend", "ReduceOp"]
