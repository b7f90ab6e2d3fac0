"""The Backend interface every transport implements (socket, mpi, nccl).

One instance serves one (process group, device type). The public functions
in ``ndist.collectives`` have already checked every argument and turned the
user's tensors into contiguous NumPy (CPU) or CuPy (CUDA) arrays when a
method is called, so a backend moves and reduces bytes and nothing else:

* ranks (``src``, ``dst``, list positions) are ranks *in this group*;
* arrays are C-contiguous; ``outputs`` / ``inputs`` lists have ``size``
  entries whose lengths may differ per peer (uneven all_gather, gather,
  scatter, all_to_all); an entry may be empty;
* every method returns a ``Work`` (``ndist.runtime.Work``) and never blocks
  past what its own completion needs; a synchronous backend returns an
  already-completed Work. Operations on one backend complete in issue order.
* failures are delivered through the Work as the typed errors of
  ``ndist.runtime`` (``DistNetworkError`` naming the peer,
  ``DistTimeoutError``, ``DistMismatchError``, ``DistBackendError``).

Adding a backend: subclass, implement the abstract methods, and register a
factory (``ndist.runtime.register_backend``); see docs/architecture.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Sequence

from ..runtime import BackendContext, Work
from ._reduce_op import ReduceOp

__all__ = ["Backend", "DONE"]

Array = Any  # numpy.ndarray or cupy.ndarray, C-contiguous

#: What a call made with ``blocking=True`` may return when it succeeded and has
#: no outputs to report: one shared, already-completed Work (never mutated).
#: The public layer recognises it and neither waits on it nor chains on it,
#: which saves a Future and its locks per synchronous call.
DONE = Work.completed("done")


class Backend(ABC):
    name: str = "abstract"
    #: When True, every method also accepts a keyword ``blocking=True``: the
    #: caller (a public function with ``async_op=False``) will wait right away,
    #: so the backend may use a blocking primitive (``MPI_Allreduce`` rather
    #: than ``MPI_Iallreduce``) and return an already-completed Work (or ``DONE``),
    #: or raise the op's error from the call itself.
    blocking_calls: bool = False

    def __init__(self, ctx: BackendContext) -> None:
        self.ctx = ctx
        self.rank = ctx.rank
        self.size = ctx.size

    # ------------------------------------------------------------ reductions
    @abstractmethod
    def all_reduce(self, buf: Array, op: ReduceOp, scale: Any = None) -> Work:
        """Reduce ``buf`` over all ranks, in place. ``scale`` is PREMUL_SUM's factor."""

    @abstractmethod
    def reduce(self, buf: Array, dst: int, op: ReduceOp, scale: Any = None) -> Work:
        """Reduce into ``buf`` on ``dst``; other ranks' ``buf`` is left unchanged."""

    @abstractmethod
    def reduce_scatter(self, out: Array, inputs: Sequence[Array], op: ReduceOp, scale: Any = None) -> Work:
        """``out`` = reduction over ranks of each rank's ``inputs[self.rank]``."""

    # ---------------------------------------------------------- data movement
    @abstractmethod
    def broadcast(self, buf: Array, src: int) -> Work:
        """Copy ``src``'s ``buf`` into every rank's ``buf``."""

    @abstractmethod
    def all_gather(self, outputs: Sequence[Array], inp: Array) -> Work:
        """``outputs[i]`` receives rank ``i``'s ``inp`` (sizes may differ per rank)."""

    @abstractmethod
    def gather(self, outputs: Sequence[Array] | None, inp: Array, dst: int) -> Work:
        """On ``dst``, ``outputs[i]`` receives rank ``i``'s ``inp``; elsewhere ``outputs`` is None."""

    @abstractmethod
    def scatter(self, out: Array, inputs: Sequence[Array] | None, src: int) -> Work:
        """Rank ``i``'s ``out`` receives ``src``'s ``inputs[i]``; ``inputs`` is None off ``src``."""

    @abstractmethod
    def all_to_all(self, outputs: Sequence[Array], inputs: Sequence[Array]) -> Work:
        """Rank ``i``'s ``inputs[j]`` lands in rank ``j``'s ``outputs[i]`` (uneven, zero allowed)."""

    @abstractmethod
    def barrier(self) -> Work:
        """Complete once every rank of the group has entered the barrier."""

    # ---------------------------------------------------------- point to point
    @abstractmethod
    def send(self, buf: Array, dst: int, tag: int = 0) -> Work:
        """Send ``buf`` to ``dst`` (may be ``self.rank``). Never blocks on the receiver."""

    @abstractmethod
    def recv(self, buf: Array, src: int | None, tag: int = 0) -> Work:
        """Receive into ``buf`` from ``src`` (``None``: any source).

        The Work's ``result()`` is ``[source_rank]`` (a group rank).
        """

    # -------------------------------------------------------------- lifetime
    @abstractmethod
    def close(self) -> None:
        """Release connections and memory. Must return promptly, also after a peer died."""

    def abort(self) -> None:
        """Fail every pending operation and close, without talking to peers."""
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} rank {self.rank}/{self.size} group {self.ctx.group_name!r}>"
