"""The seam between the public collectives and the backends (socket, mpi, nccl).

One ``CollectiveBackend`` instance serves one (process group, device type).
Every operation reaches it as one immutable ``Call`` record, built once by
the public function after it checked every argument; the same record goes to
the flight recorder and the ``NDIST_DEBUG=DETAIL`` check. So a backend moves
and reduces bytes and re-checks nothing, except what only it can know (NCCL's
dtype limits):

* ranks (``root``, list positions) are ranks *in this group*;
* arrays are C-contiguous NumPy (CPU) or CuPy (CUDA) arrays; list entries are
  1-D and may differ in length per peer (uneven all_gather, gather, scatter,
  all_to_all); an entry may be empty; the single-buffer forms get 1-D buffers;
* every method returns a ``Work`` (``ndist.runtime.Work``) and never blocks
  past what its own completion needs. With ``blocking=True`` (the caller will
  wait at once: ``async_op=False``) a backend may use a blocking primitive and
  return an already-completed Work, or the shared ``DONE`` when it succeeded
  with nothing to report, or raise the op's error from the call itself (a
  stream-ordered backend, nccl, returns ``DONE`` once the op is enqueued on the
  current stream, as torch's synchronous calls return);
* operations on one backend complete in issue order;
* failures are the typed errors of ``ndist.runtime`` (``DistNetworkError``
  naming the peer, ``DistTimeoutError``, ``DistMismatchError``,
  ``DistBackendError``).

Three ops come in two forms, each with a default in terms of the other, so a
backend overrides the form it does natively (at least one of each pair):

=====================  =========================  ===========================
list form              single-buffer form         single-buffer arguments
=====================  =========================  ===========================
``all_to_all``         ``all_to_all_single``      ``out``, ``inp``, ``out_splits``,
                                                  ``in_splits`` (None: even)
``all_gather``         ``all_gather_into``        ``out``, ``inp``, ``out_splits``
``reduce_scatter``     ``reduce_scatter_from``    ``out``, ``inp``, ``in_splits``
=====================  =========================  ===========================

Splits count elements per rank; ``None`` means equal chunks, a promise every
rank makes alike (torch's contract for ``all_to_all_single`` without split
sizes, ``all_gather_into_tensor`` and ``reduce_scatter_tensor``), so a backend
may pick a different primitive for it (``MPI_Alltoall`` rather than
``MPI_Alltoallv``).

Adding a backend: subclass, implement the abstract methods and one form of
each pair, and register a factory (``ndist.runtime.register_backend``); see
docs/architecture.md.
"""

from __future__ import annotations

import contextlib
import enum
from abc import ABC, abstractmethod
from typing import Any, NamedTuple, Sequence

from ..runtime import BackendContext, Work
from ._reduce_op import ReduceOp

__all__ = ["CollectiveBackend", "Call", "Op", "DONE"]

Array = Any  # numpy.ndarray or cupy.ndarray, C-contiguous

#: What a call made with ``blocking=True`` may return when it succeeded and has
#: no outputs to report: one shared, already-completed Work (never mutated).
#: The public layer recognises it and neither waits on it nor chains on it,
#: which saves a Future and its locks per synchronous call.
DONE = Work.completed("done")


class Op(str, enum.Enum):
    """The operations of the interface; the value is the method's name."""

    ALL_REDUCE = "all_reduce"
    REDUCE = "reduce"
    REDUCE_SCATTER = "reduce_scatter"
    REDUCE_SCATTER_FROM = "reduce_scatter_from"
    BROADCAST = "broadcast"
    ALL_GATHER = "all_gather"
    ALL_GATHER_INTO = "all_gather_into"
    GATHER = "gather"
    SCATTER = "scatter"
    ALL_TO_ALL = "all_to_all"
    ALL_TO_ALL_SINGLE = "all_to_all_single"
    BARRIER = "barrier"
    SEND = "send"
    RECV = "recv"

    def __str__(self) -> str:
        return self.value


P2P_OPS = frozenset((Op.SEND, Op.RECV))


class Call(NamedTuple):
    """One operation as the public layer checked it (immutable).

    Which fields an op uses: ``out`` is the in-place buffer (all_reduce,
    reduce, broadcast, send / recv) or the single output (scatter,
    reduce_scatter and the single-buffer forms); ``inp`` the single input
    (all_gather, gather and the single-buffer forms); ``outputs`` /
    ``inputs`` the per-rank lists of the list forms (``None`` off the root of
    gather / scatter). ``root`` is the root's group rank, or the peer of send /
    recv (``None``: recv from any source). ``scale`` is PREMUL_SUM's factor.

    A NamedTuple rather than a frozen dataclass: one is built per call on the
    hot path, and a tuple is built several times faster.
    """

    op: Op
    device: str
    dtype: Any = None
    out: Array = None
    inp: Array = None
    outputs: Sequence[Array] | None = None
    inputs: Sequence[Array] | None = None
    out_splits: Sequence[int] | None = None
    in_splits: Sequence[int] | None = None
    root: int | None = None
    redop: ReduceOp | None = None
    scale: Any = None
    tag: int = 0

    # -------------------------------------------------------- what it moves
    def totals(self) -> tuple[int, int]:
        """``(count_in, count_out)``: elements this rank contributes and receives in all
        (what the flight recorder keeps on every call: no per-peer lists)."""
        op, out, inp = self.op, self.out, self.inp
        if inp is None:
            if op is Op.SCATTER or op is Op.REDUCE_SCATTER:
                ins = self.inputs
                return (0 if ins is None else sum(a.size for a in ins)), out.size
            if out is None:
                if op is Op.BARRIER:
                    return 0, 0
                outs, ins = self.outputs, self.inputs  # all_to_all
                return sum(a.size for a in ins), sum(a.size for a in outs)
            return out.size, out.size  # in place: all_reduce, reduce, broadcast, send, recv
        if out is not None:
            return inp.size, out.size  # the single-buffer forms
        outs = self.outputs  # all_gather; gather (None off the root)
        return inp.size, (0 if outs is None else sum(a.size for a in outs))

    def counts(self, size: int) -> tuple[int, int, list[int] | None, list[int] | None]:
        """``(count_in, count_out, ins, outs)``: elements this rank contributes and
        receives in all, and per peer (``ins[j]`` sent to / ``outs[j]`` received
        from group rank ``j``; ``None`` where the op has no per-peer sizes)."""
        op = self.op
        if op in (Op.ALL_REDUCE, Op.REDUCE, Op.BROADCAST, Op.SEND, Op.RECV):
            n = int(self.out.size)
            return n, n, None, None
        if op is Op.BARRIER:
            return 0, 0, None, None
        if op is Op.REDUCE_SCATTER:
            ins = _sizes(self.inputs)
            return sum(ins), int(self.out.size), ins, None
        if op is Op.REDUCE_SCATTER_FROM:
            ins = list(self.in_splits) if self.in_splits is not None else _even(self.inp.size, size)
            return int(self.inp.size), int(self.out.size), ins, None
        if op is Op.ALL_GATHER:
            outs = _sizes(self.outputs)
            return int(self.inp.size), sum(outs), None, outs
        if op is Op.ALL_GATHER_INTO:
            outs = list(self.out_splits) if self.out_splits is not None else _even(self.out.size, size)
            return int(self.inp.size), int(self.out.size), None, outs
        if op is Op.GATHER:
            outs = _sizes(self.outputs) if self.outputs is not None else None
            return int(self.inp.size), sum(outs) if outs else 0, None, outs
        if op is Op.SCATTER:
            ins = _sizes(self.inputs) if self.inputs is not None else None
            return sum(ins) if ins else 0, int(self.out.size), ins, None
        if op is Op.ALL_TO_ALL:
            ins, outs = _sizes(self.inputs), _sizes(self.outputs)
            return sum(ins), sum(outs), ins, outs
        if op is Op.ALL_TO_ALL_SINGLE:
            ins = list(self.in_splits) if self.in_splits is not None else _even(self.inp.size, size)
            outs = list(self.out_splits) if self.out_splits is not None else _even(self.out.size, size)
            return int(self.inp.size), int(self.out.size), ins, outs
        raise AssertionError(f"unknown op {op!r}")


def _sizes(arrays) -> list[int]:
    return [int(a.size) for a in arrays]


def _even(total: int, n: int) -> list[int]:
    return [int(total) // n] * n


def split_views(flat: Array, splits: Sequence[int] | None, n: int) -> list:
    """Views of the 1-D ``flat`` cut into ``splits`` elements per rank (None: ``n`` equal chunks)."""
    if splits is None:
        k = flat.size // n
        return [flat[i * k:(i + 1) * k] for i in range(n)]
    views, pos = [], 0
    for s in splits:
        views.append(flat[pos:pos + s])
        pos += s
    return views


def array_module(arr: Array):
    """NumPy or CuPy: the module of ``arr``."""
    import numpy

    if isinstance(arr, numpy.ndarray):
        return numpy
    import cupy  # a CUDA array: CuPy is installed

    return cupy


def _packed(arrays: Sequence[Array], dtype, like: Array) -> Array:
    """``arrays`` back to back in one new 1-D buffer."""
    xp = array_module(like)
    if not arrays:
        return xp.empty(0, dtype)
    return xp.concatenate([a.reshape(-1) for a in arrays]) if len(arrays) > 1 else arrays[0].reshape(-1)


def unpack(flat: Array, arrays: Sequence[Array]) -> None:
    """Copy the 1-D ``flat`` into ``arrays``, back to back."""
    pos = 0
    for a in arrays:
        a.reshape(-1)[...] = flat[pos:pos + a.size]
        pos += a.size


def _unpack_after(work: Work, flat: Array, arrays: Sequence[Array]) -> Work:
    """Copy ``flat`` back into ``arrays`` once ``work`` is done; the Work that covers it."""
    if work is DONE:
        unpack(flat, arrays)
        return DONE
    return work.then(lambda: unpack(flat, arrays))


def _overrides(cls: type, name: str) -> bool:
    return getattr(cls, name) is not getattr(CollectiveBackend, name)


#: (list form, single-buffer form): a backend must implement at least one of each.
FORM_PAIRS = (("all_to_all", "all_to_all_single"), ("all_gather", "all_gather_into"),
              ("reduce_scatter", "reduce_scatter_from"))
_ABSTRACT = ("all_reduce", "reduce", "broadcast", "gather", "scatter", "barrier", "send", "recv", "close")


class CollectiveBackend(ABC):
    """The interface (see the module docstring)."""

    name: str = "abstract"

    def __init__(self, ctx: BackendContext) -> None:
        self.ctx = ctx
        self.rank = ctx.rank
        self.size = ctx.size

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # (ABCMeta sets __abstractmethods__ only after this runs: look for them directly)
        if any(getattr(getattr(cls, m, None), "__isabstractmethod__", False) for m in _ABSTRACT):
            return  # still abstract: checked on its concrete subclasses
        for a, b in FORM_PAIRS:
            if not (_overrides(cls, a) or _overrides(cls, b)):
                raise TypeError(f"{cls.__name__}: implement {a} or {b} (each has a default in terms of the "
                                f"other)")

    # ------------------------------------------------------------ reductions
    @abstractmethod
    def all_reduce(self, call: Call, *, blocking: bool = False) -> Work:
        """Reduce ``call.out`` over all ranks, in place (``call.redop``, ``call.scale``)."""

    @abstractmethod
    def reduce(self, call: Call, *, blocking: bool = False) -> Work:
        """Reduce into ``call.out`` on ``call.root``; other ranks' ``out`` is left unchanged."""

    def reduce_scatter(self, call: Call, *, blocking: bool = False) -> Work:
        """``call.out`` = reduction over ranks of each rank's ``call.inputs[self.rank]``.

        Default: the inputs packed into one buffer, then ``reduce_scatter_from``.
        """
        flat = _packed(call.inputs, call.dtype, call.out)
        return self.reduce_scatter_from(call._replace(op=Op.REDUCE_SCATTER_FROM, inp=flat, inputs=None,
                                                      in_splits=_sizes(call.inputs)), blocking=blocking)

    def reduce_scatter_from(self, call: Call, *, blocking: bool = False) -> Work:
        """``call.out`` = reduction over ranks of their chunk ``self.rank`` of ``call.inp``
        (chunks of ``call.in_splits`` elements; None: equal chunks).

        Default: views of the chunks, then ``reduce_scatter``.
        """
        views = split_views(call.inp, call.in_splits, self.size)
        return self.reduce_scatter(call._replace(op=Op.REDUCE_SCATTER, inputs=views, inp=None, in_splits=None),
                                   blocking=blocking)

    # ---------------------------------------------------------- data movement
    @abstractmethod
    def broadcast(self, call: Call, *, blocking: bool = False) -> Work:
        """Copy ``call.root``'s ``call.out`` into every rank's ``call.out``."""

    def all_gather(self, call: Call, *, blocking: bool = False) -> Work:
        """``call.outputs[i]`` receives rank ``i``'s ``call.inp`` (sizes may differ per rank).

        Default: ``all_gather_into`` a new buffer, then copied into the outputs.
        """
        xp = array_module(call.inp)
        sizes = _sizes(call.outputs)
        flat = xp.empty(sum(sizes), call.dtype)
        work = self.all_gather_into(call._replace(op=Op.ALL_GATHER_INTO, out=flat, outputs=None,
                                                  out_splits=sizes), blocking=blocking)
        return _unpack_after(work, flat, call.outputs)

    def all_gather_into(self, call: Call, *, blocking: bool = False) -> Work:
        """``call.out`` = every rank's ``call.inp`` back to back in rank order (``call.out_splits``
        elements from each; None: equal).

        Default: views of ``out``, then ``all_gather``.
        """
        views = split_views(call.out, call.out_splits, self.size)
        return self.all_gather(call._replace(op=Op.ALL_GATHER, outputs=views, out=None, out_splits=None),
                               blocking=blocking)

    @abstractmethod
    def gather(self, call: Call, *, blocking: bool = False) -> Work:
        """On ``call.root``, ``call.outputs[i]`` receives rank ``i``'s ``call.inp``;
        elsewhere ``call.outputs`` is None."""

    @abstractmethod
    def scatter(self, call: Call, *, blocking: bool = False) -> Work:
        """Rank ``i``'s ``call.out`` receives ``call.root``'s ``call.inputs[i]``;
        ``call.inputs`` is None off the root."""

    def all_to_all(self, call: Call, *, blocking: bool = False) -> Work:
        """Rank ``i``'s ``call.inputs[j]`` lands in rank ``j``'s ``call.outputs[i]``.

        Default: the inputs packed into one buffer, ``all_to_all_single`` into a
        new one, then copied into the outputs.
        """
        like = call.inputs[0] if call.inputs else call.outputs[0]
        xp = array_module(like)
        flat_in = _packed(call.inputs, call.dtype, like)
        out_sizes = _sizes(call.outputs)
        flat_out = xp.empty(sum(out_sizes), call.dtype)
        work = self.all_to_all_single(call._replace(op=Op.ALL_TO_ALL_SINGLE, out=flat_out, inp=flat_in,
                                                    outputs=None, inputs=None, out_splits=out_sizes,
                                                    in_splits=_sizes(call.inputs)), blocking=blocking)
        return _unpack_after(work, flat_out, call.outputs)

    def all_to_all_single(self, call: Call, *, blocking: bool = False) -> Work:
        """Chunk ``j`` of ``call.inp`` (``call.in_splits[j]`` elements) lands in rank ``j``'s
        ``call.out`` at chunk ``self.rank`` (``call.out_splits``; None: equal chunks).

        Default: views of both buffers, then ``all_to_all``.
        """
        n = self.size
        return self.all_to_all(call._replace(op=Op.ALL_TO_ALL, outputs=split_views(call.out, call.out_splits, n),
                                             inputs=split_views(call.inp, call.in_splits, n), out=None, inp=None,
                                             out_splits=None, in_splits=None), blocking=blocking)

    @abstractmethod
    def barrier(self, call: Call, *, blocking: bool = False) -> Work:
        """Complete once every rank of the group has entered the barrier."""

    # ---------------------------------------------------------- point to point
    @abstractmethod
    def send(self, call: Call, *, blocking: bool = False) -> Work:
        """Send ``call.out`` to ``call.root`` with ``call.tag`` (may be ``self.rank``).
        Never blocks on the receiver."""

    @abstractmethod
    def recv(self, call: Call, *, blocking: bool = False) -> Work:
        """Receive into ``call.out`` from ``call.root`` (``None``: any source) with ``call.tag``.

        The Work's ``result()`` is ``[source_rank]`` (a group rank).
        """

    # ------------------------------------------------------------- batching
    #: Whether ``coalescing()`` groups the operations issued inside it (nccl:
    #: one NCCL group, so opposite sends of ``batch_isend_irecv`` cannot deadlock).
    coalesces: bool = False

    def coalescing(self) -> contextlib.AbstractContextManager:
        """A block whose operations the backend may issue together. Default: no grouping."""
        return contextlib.nullcontext(self)

    # ------------------------------------------------------------ recording
    def recorder_types(self):
        """``(ring type, counter type)`` for the group's flight recorder when the backend
        numbers and records its calls itself from C (``FlightRecorder.adopt``, asked once when
        the public layer makes the group's lane), or None (default): the recorder keeps its
        Python deque and counters."""
        return None

    # -------------------------------------------------------------- lifetime
    @abstractmethod
    def close(self) -> None:
        """Release connections and memory. Must return promptly, also after a peer died."""

    def abort(self) -> None:
        """Fail every pending operation and close, without talking to peers."""
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} rank {self.rank}/{self.size} group {self.ctx.group_name!r}>"
