"""``ProcessGroupNdist``: a torch ``ProcessGroup`` implemented in Python over an
ndist process group, torch's group itself on every supported release (2.13, 2.14).

Not torch 2.14's Python ``c10d::Backend`` (the ``PyBackend`` trampoline): 2.13's
``Backend`` has no constructor Python can call, and on 2.14.1 every Work such a backend
returns reaches the caller inside torch's ``PyWorkHolder``, which passes on only ``wait``
and ``get_future`` (``is_completed()`` stays False, ``_source_rank()`` raises: torch's
own suite failed 7 tests that way). docs/torch.md, "Supported torch releases".

torch calls one method per op with its own argument shapes (lists of tensors,
``*Options`` structs with group ranks); each method maps that onto ndist's
public collectives (``ndist.distributed``) on NumPy views of the tensors
(``Tensor.numpy()``: the same memory, no copy; ndist stages non-contiguous
outputs and writes them back). Ranks in ``opts.rootRank`` / ``dstRank`` /
``srcRank`` are group ranks, passed on as ``group_src`` / ``group_dst``.

When torch will wait right away (``opts.asyncOp`` is False: a public
function called without ``async_op``), the op runs synchronously in ndist
(inline on the caller's thread) and the Work returned is already complete;
otherwise (``async_op=True``, DDP's reducer, functional collectives) ndist
runs it in the background and the Work completes with it.

Per call this layer does little beyond torch's own Python: one ``numpy()``
per tensor, the reduce op by its hash, and on a blocking call the group's
complete Work, or none for torch's own public function (``_WAITS``); no closure,
lock or future on a blocking call.
"""

from __future__ import annotations

import atexit
import inspect
import logging
import sys
import weakref
from datetime import timedelta
from typing import Any, Callable, Sequence

import torch
import torch.distributed as tdist

from .. import distributed as nd
from ..runtime import DistError
from ..runtime import ProcessGroup as NdistGroup
from ..collectives._convert import as_array
from ..runtime._errors import LEFT
from . import _shrink, _watch
from ._work import NdistWork, done_work

__all__ = ["ProcessGroupNdist", "BACKEND_NAME"]

log = logging.getLogger("ndist.torch")

BACKEND_NAME = "ndist"

_live: "weakref.WeakSet[ProcessGroupNdist]" = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    """A program that exits without ``destroy_process_group`` (an exception from a
    failed op, say) still releases its shared memory; never waits on a dead peer."""
    for pg in list(_live):
        try:
            pg.abort()
        except Exception:  # noqa: BLE001 - exit must go on
            log.warning("closing %r at exit failed", pg, exc_info=True)


_RED = tdist.ReduceOp.RedOpType
_REDUCE_OPS = {
    _RED.SUM: nd.ReduceOp.SUM, _RED.AVG: nd.ReduceOp.AVG, _RED.PRODUCT: nd.ReduceOp.PRODUCT,
    _RED.MIN: nd.ReduceOp.MIN, _RED.MAX: nd.ReduceOp.MAX, _RED.BAND: nd.ReduceOp.BAND,
    _RED.BOR: nd.ReduceOp.BOR, _RED.BXOR: nd.ReduceOp.BXOR,
}


def _by_hash() -> dict:
    """ndist's op by ``hash()`` of torch's ``ReduceOp``, which torch 2.13 defines as the
    kind's value: one C call, where ``op.op`` makes an enum object whose hash is a Python
    call. Empty (so ``_reduce_op`` takes the long way) unless that holds for every kind."""
    ops = {}
    for kind, ours in _REDUCE_OPS.items():
        h = hash(tdist.ReduceOp(kind))
        if h != kind.value or h != hash(tdist.ReduceOp(kind)) or h in ops:
            return {}
        ops[h] = ours
    return ops


_REDUCE_BY_HASH = _by_hash()
# The same as a tuple indexed by the hash (a kind's value, 0..9 in torch 2.13): indexing
# a tuple costs less than a dict's get; None (PREMUL_SUM, UNUSED) and an IndexError
# mean the long way.
_BY_KIND = tuple(_REDUCE_BY_HASH.get(h) for h in range(max(_REDUCE_BY_HASH, default=-1) + 1))


_TorchReduceOp = tdist.ReduceOp


def _reduce_op(op) -> Any:
    """torch's ``ReduceOp`` (or its ``RedOpType``) -> ndist's."""
    if type(op) is _TorchReduceOp:
        ours = _REDUCE_BY_HASH.get(hash(op))
        if ours is not None:
            return ours
    kind = getattr(op, "op", op)
    ours = _REDUCE_OPS.get(kind) if isinstance(kind, _RED) else None
    if ours is not None:
        return ours
    if kind == _RED.PREMUL_SUM:
        factor = op.factor
        if isinstance(factor, torch.Tensor):
            factor = factor.item()
        return nd._make_nccl_premul_sum(factor)
    raise ValueError(f"op: expected a torch.distributed.ReduceOp, got {op!r}")


class _Blocking:
    """What a blocking call reads, behind one attribute of the group: attribute loads
    from the instance of a torch ``ProcessGroup`` subclass take the interpreter's
    generic path (its instance dict is not one CPython 3.11 specializes: ~270
    instructions each), those from this slotted object do not. ``group`` is the
    ndist group, ``timeout`` the default wait (seconds) of its Works, ``direct``
    whether torch's public functions were seen calling the group's methods
    themselves (``_called_by``)."""

    __slots__ = ("group", "timeout", "direct")

    def __init__(self, group: NdistGroup, timeout: float) -> None:
        self.group = group
        self.timeout = timeout
        self.direct = False


def _waits() -> dict:
    """The code of the torch public function that calls each method with ``asyncOp``
    False only to ``wait()`` on the Work it gets and drop it, by method name.

    torch 2.13's ``all_reduce``, ``broadcast``, ``all_gather_single`` (which
    ``all_gather_into_tensor`` calls), ``reduce_scatter_single`` (and
    ``reduce_scatter_tensor``) and ``all_to_all_single`` end in ``if async_op: return
    work / elif work is not None: work.wait()`` ("backends that don't sync at CPP
    level"): a backend that already finished may return None. To that caller, and
    only to it (the calling frame's code object), a blocking call returns None: no
    torch Work made (pybind's ``__init__``, ~4.7k instructions with ours) and no
    ``wait()`` call. Every other caller (``pg.allreduce(...)`` called directly, C++)
    gets a complete Work with its outputs. A function not found as expected (another
    torch: not calling the method and ``wait``, or whose source does not test the Work
    for None), or without its source, is left out, and its calls get a Work."""
    c10d = tdist.distributed_c10d
    found = {}
    for fn_name, method in (("all_reduce", "allreduce"), ("broadcast", "broadcast"),
                            ("all_gather_single", "all_gather_single"),
                            ("reduce_scatter_single", "reduce_scatter_single"),
                            ("all_to_all_single", "all_to_all_single")):
        fn = inspect.unwrap(getattr(c10d, fn_name, None))
        code = getattr(fn, "__code__", None)
        if code is None or method not in code.co_names or "wait" not in code.co_names:
            continue
        try:  # its source must test the Work for None before it waits (torch 2.13 does)
            if "work is not None" in inspect.getsource(fn):
                found[method] = code
        except (OSError, TypeError):  # no source (a frozen or stripped install): keep the Work
            pass
    return found


_WAITS = _waits()
# one global per method: None matches no frame's code
_WAITS_ALLREDUCE = _WAITS.get("allreduce")
_WAITS_BROADCAST = _WAITS.get("broadcast")
_WAITS_ALL_GATHER = _WAITS.get("all_gather_single")
_WAITS_REDUCE_SCATTER = _WAITS.get("reduce_scatter_single")
_WAITS_ALL_TO_ALL = _WAITS.get("all_to_all_single")
_caller = sys._getframe


def _called_by(sync: _Blocking, pg: Any, frame: Any) -> bool:
    """Whether the torch public function running in ``frame`` called ``pg``'s method
    itself (its ``group`` is ``pg``), not a torch group of its own that reached ``pg``
    through C++ (no Python frame between), to which None would be a null Work. torch
    2.13 uses a Python ProcessGroup as the group itself; asked until it holds once per
    group, then remembered in ``sync.direct`` (reading a frame's locals costs more)."""
    if frame.f_locals.get("group") is pg:
        sync.direct = True
        return True
    return False


def _one(tensors: Sequence[torch.Tensor], name: str):
    """The single tensor of torch's one-element lists (one device per process), as an array."""
    if len(tensors) != 1:
        raise ValueError(f"{name}: expected a list of 1 tensor (the ndist backend takes one tensor per "
                         f"process), got {len(tensors)}")
    try:  # _cpu's first step, inline (every call)
        return tensors[0].numpy()
    except (TypeError, RuntimeError):
        return _cpu(tensors[0], name, 0)


def _cpu(t: torch.Tensor, name: str, index: int = -1):
    """``t``'s memory as a NumPy array (same memory, same strides), or ValueError naming
    ``name`` (``name[index]`` for a list's element).

    ndist takes torch tensors itself, but at several times the cost of
    ``Tensor.numpy()`` (issue #16); what ``numpy()`` takes is a dense CPU tensor
    that does not require grad, of a dtype NumPy has. Asking it is cheaper than
    checking first (each attribute of a tensor is a call into torch).
    """
    try:
        return t.numpy()
    except (TypeError, RuntimeError):
        pass  # not on the CPU, not strided, conjugated, requiring grad, bfloat16: checked below
    if index >= 0:
        name = f"{name}[{index}]"
    if t.device.type != "cpu":
        raise ValueError(f"{name}: expected a CPU tensor (backend {BACKEND_NAME!r} serves 'cpu'), "
                         f"got one on {t.device}")
    if t.layout != torch.strided:
        raise ValueError(f"{name}: expected a dense (strided) tensor, got layout {t.layout}")
    return as_array(t, name)  # detached; bfloat16 as ml_dtypes'


def _two(output: torch.Tensor, input: torch.Tensor) -> tuple:  # noqa: A002 - torch's names
    """``_cpu`` of an op's output and input tensors, the common case first."""
    try:
        return output.numpy(), input.numpy()
    except (TypeError, RuntimeError):
        return _cpu(output, "output"), _cpu(input, "input")


def _cpus(tensors: Sequence[torch.Tensor], name: str) -> list:
    return [_cpu(t, name, i) for i, t in enumerate(tensors)]


class ProcessGroupNdist(tdist.ProcessGroup):
    """A torch process group whose collectives run on an ndist process group.

    ``store`` is an ndist Store (torch's, wrapped), ``rank`` / ``size`` the
    group rank and size, ``global_ranks`` the torch global ranks of the group
    (the mpi backend needs them to be ``MPI_COMM_WORLD``'s), ``backend`` the
    ndist backend underneath (``"socket"`` or ``"mpi"``).
    """

    def __init__(self, store, rank: int, size: int, timeout: timedelta, group_name: str,
                 global_ranks: Sequence[int] = (), backend: str = "socket", options: Any = None,
                 numbering: str = "") -> None:
        super().__init__(rank, size)
        ranks = tuple(global_ranks) or tuple(range(size))
        if len(ranks) != size:
            raise ValueError(f"global_ranks: expected {size} ranks (the group size), got {list(global_ranks)}")
        self._nd_timeout = timeout.total_seconds()
        self._nd_ranks = ranks  # group rank -> global rank: the form ndist's short paths take
        self._nd_backend = backend
        self._nd_coalesced: list | None = None
        self._nd_name, self._nd_desc = group_name, ""
        self._nd_group = NdistGroup(ranks, ranks[rank], f"torch-{group_name}", store, {"cpu": backend}, timeout,
                                 options)
        # the numbering its global ranks are in (a grown default group's is new: ``_grow``)
        self._nd_group.numbering = numbering
        # Created now, not on the first op: every rank builds its backend during
        # init_process_group / new_group (the mpi backend's communicator creation is
        # collective), and a peer that cannot be reached fails here.
        self._nd_group.backend_for("cpu")
        # the blocking path's state; None while coalescing (every op then runs in the background)
        self._nd_sync: _Blocking | None = _Blocking(self._nd_group, self._nd_timeout)
        _live.add(self)
        log.info("torch process group %r: ndist %s backend, rank %d of %d", group_name, backend, rank, size)

    # ---------------------------------------------------------- identity
    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    # torch sets and reads a group's name and description through these (functional
    # collectives find the group by name); a Python group keeps them itself.
    def getGroupName(self) -> str:  # noqa: N802 - torch's names
        return self._nd_name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._nd_name = name

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._nd_desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._nd_desc = desc

    @property
    def ndist_group(self) -> NdistGroup:
        """The ndist process group underneath (for ``ndist.distributed`` calls on it)."""
        return self._nd_group

    @property
    def ndist_backend(self) -> str:
        """The ndist backend underneath: ``"socket"`` or ``"mpi"`` (``Options.backend``)."""
        return self._nd_backend

    def __repr__(self) -> str:
        return f"<ProcessGroupNdist rank={self.rank()} size={self.size()} backend={self._nd_backend!r}>"

    # --------------------------------------------------------- plumbing
    def _async(self, opts: Any) -> bool:
        """Whether ndist runs the op in the background: torch will not wait at once
        (``opts.asyncOp``; no options: yes), or the group is coalescing."""
        return opts is None or self._nd_coalesced is not None or opts.asyncOp

    def _run(self, op: str, outputs: list, async_op: bool, fn: Callable[..., Any], *args: Any) -> NdistWork:
        """``fn(*args)``, an ndist collective whose ``args`` carry ``async_op``; the Work torch gets.

        Synchronous calls that fail return a failed Work (torch raises from
        ``wait()``); bad arguments raise here, before anything was sent.
        """
        if async_op:
            work = fn(*args)
            if self._nd_coalesced is not None:
                self._nd_coalesced.append(work)
            return NdistWork([work], outputs, self._nd_timeout, op)
        try:
            fn(*args)
        except DistError as exc:
            return NdistWork((), outputs, self._nd_timeout, op, error=exc)
        return done_work(outputs, self._nd_timeout, op)

    def _run_each(self, op: str, outputs: list, opts: Any, fn: Callable[..., Any], calls: list[tuple]) -> NdistWork:
        """The coalesced forms: ``fn(*args, True)`` for each ``args`` of ``calls``, issued
        back to back, one Work."""
        works = [fn(*args, True) for args in calls]
        if self._nd_coalesced is not None:
            self._nd_coalesced.extend(works)
        work = NdistWork(works, outputs, self._nd_timeout, op)
        if not self._async(opts):
            try:
                work.wait()
            except tdist.DistError as err:
                return NdistWork((), outputs, self._nd_timeout, op, error=err)
        return work

    # The ndist collectives take positional arguments here (no closure or keyword
    # dict per call); their order, from ndist.collectives._api:
    #   all_reduce(tensor, op, group, async_op)
    #   reduce(tensor, dst, op, group, async_op, group_dst)
    #   reduce_scatter(output, input_list, op, group, async_op)
    #   reduce_scatter_tensor(output, input, op, group, async_op)
    #   broadcast(tensor, src, group, async_op, group_src)
    #   all_gather(tensor_list, tensor, group, async_op)
    #   all_gather_into_tensor(output_tensor, input_tensor, group, async_op)
    #   gather(tensor, gather_list, dst, group, async_op, group_dst)
    #   scatter(tensor, scatter_list, src, group, async_op, group_src)
    #   all_to_all(output_tensor_list, input_tensor_list, group, async_op)
    #   all_to_all_single(output, input, output_split_sizes, input_split_sizes, group, async_op)
    #   barrier(group, async_op)

    # ----------------------------------------------------- reductions
    # The blocking path of the frequent ops (torch's public functions without
    # async_op) comes first in each method, inline: the options' asyncOp, one load of
    # the group's state, the views, ndist's call and the group's reused Work.
    def allreduce(self, tensors, opts=None):
        sync = self._nd_sync
        blocking = sync is not None and opts is not None and not opts.asyncOp
        try:  # _one's first step, inline
            (t,) = tensors
            t = t.numpy()
        except (ValueError, TypeError, RuntimeError):
            t = _one(tensors, "tensors")
        if opts is None:
            return self._run("allreduce", tensors, True, nd.all_reduce, t, nd.ReduceOp.SUM, self._nd_group, True)
        op = opts.reduceOp
        try:  # _reduce_op's first step, inline
            ours = _BY_KIND[hash(op)] if type(op) is _TorchReduceOp else None
        except IndexError:
            ours = None
        if ours is None:
            ours = _reduce_op(op)
        if not blocking:  # DDP's buckets, async_op=True, coalescing
            return self._run("allreduce", tensors, True, nd.all_reduce, t, ours, self._nd_group, True)
        try:
            nd.all_reduce(t, ours, sync.group, False)
        except DistError as exc:
            return NdistWork((), tensors, sync.timeout, "allreduce", error=exc)
        caller = _caller(1)
        if caller.f_code is _WAITS_ALLREDUCE and (sync.direct or _called_by(sync, self, caller)):
            return None  # torch's public function: it only waits on a Work it gets (_WAITS)
        return done_work(tensors, sync.timeout, "allreduce")

    def allreduce_coalesced(self, tensors, opts=None):
        ts = _cpus(tensors, "tensors")
        op = _reduce_op(opts.reduceOp) if opts is not None else nd.ReduceOp.SUM
        g = self._nd_group
        return self._run_each("allreduce_coalesced", tensors, opts, nd.all_reduce, [(t, op, g) for t in ts])

    def reduce(self, tensors, opts=None):
        t = _one(tensors, "tensors")
        op = _reduce_op(opts.reduceOp)
        a = self._async(opts)
        return self._run("reduce", tensors, a, nd.reduce, t, None, op, self._nd_group, a, opts.rootRank)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        out = _one(output_tensors, "output_tensors")
        if len(input_tensors) != 1:
            raise ValueError(f"input_tensors: expected a list of 1 list of tensors, got {len(input_tensors)}")
        ins = _cpus(input_tensors[0], "input_tensors[0]")
        op = _reduce_op(opts.reduceOp)
        a = self._async(opts)
        return self._run("reduce_scatter", output_tensors, a, nd.reduce_scatter, out, ins, op, self._nd_group, a)

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002 - torch's names
        sync = self._nd_sync
        blocking = sync is not None and not opts.asyncOp
        out, inp = _two(output, input)
        op = opts.reduceOp
        try:  # _reduce_op's first step, inline
            ours = _BY_KIND[hash(op)] if type(op) is _TorchReduceOp else None
        except IndexError:
            ours = None
        op = ours if ours is not None else _reduce_op(op)
        if not blocking:
            return self._run("reduce_scatter_single", [output], True, nd.reduce_scatter_tensor, out, inp, op,
                             self._nd_group, True)
        try:
            nd.reduce_scatter_tensor(out, inp, op, sync.group, False)
        except DistError as exc:
            return NdistWork((), [output], sync.timeout, "reduce_scatter_single", error=exc)
        caller = _caller(1)
        if caller.f_code is _WAITS_REDUCE_SCATTER and (sync.direct or _called_by(sync, self, caller)):
            return None  # torch's public function: it only waits on a Work it gets (_WAITS)
        return done_work([output], sync.timeout, "reduce_scatter_single")

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        outs, ins = _cpus(outputs, "outputs"), _cpus(inputs, "inputs")
        if len(outs) != len(ins):
            raise ValueError(f"inputs: expected {len(outs)} tensors (one per output), got {len(ins)}")
        op = _reduce_op(opts.reduceOp)
        g = self._nd_group
        return self._run_each("reduce_scatter_single_coalesced", list(outputs), opts, nd.reduce_scatter_tensor,
                              [(o, i, op, g) for o, i in zip(outs, ins)])

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -------------------------------------------------- data movement
    def broadcast(self, tensors, opts=None):
        sync = self._nd_sync
        a = sync is None or opts is None or opts.asyncOp
        try:  # _one's first step, inline
            (t,) = tensors
            t = t.numpy()
        except (ValueError, TypeError, RuntimeError):
            t = _one(tensors, "tensors")
        root = opts.rootRank if opts is not None else 0
        ranks = self._nd_ranks
        if type(root) is int and 0 <= root < len(ranks):
            # the root as a global rank: ndist's short path for a repeated call takes that form
            src, group_src = ranks[root], None
        else:
            src, group_src = None, root  # ndist names the bad value
        if a:
            return self._run("broadcast", tensors, True, nd.broadcast, t, src, self._nd_group, True, group_src)
        try:
            nd.broadcast(t, src, sync.group, False, group_src)
        except DistError as exc:
            return NdistWork((), tensors, sync.timeout, "broadcast", error=exc)
        caller = _caller(1)
        if caller.f_code is _WAITS_BROADCAST and (sync.direct or _called_by(sync, self, caller)):
            return None  # torch's public function: it only waits on a Work it gets (_WAITS)
        return done_work(tensors, sync.timeout, "broadcast")

    def allgather(self, output_tensors, input_tensors, opts=None):
        inp = _one(input_tensors, "input_tensors")
        if len(output_tensors) != 1:
            raise ValueError(f"output_tensors: expected a list of 1 list of tensors, got {len(output_tensors)}")
        outs = _cpus(output_tensors[0], "output_tensors[0]")
        a = self._async(opts)
        return self._run("allgather", output_tensors, a, nd.all_gather, outs, inp, self._nd_group, a)

    def all_gather_single(self, output, input, opts=None):  # noqa: A002
        sync = self._nd_sync
        blocking = sync is not None and opts is not None and not opts.asyncOp
        out, inp = _two(output, input)
        if not blocking:
            return self._run("all_gather_single", [output], True, nd.all_gather_into_tensor, out, inp,
                             self._nd_group, True)
        try:
            nd.all_gather_into_tensor(out, inp, sync.group, False)
        except DistError as exc:
            return NdistWork((), [output], sync.timeout, "all_gather_single", error=exc)
        caller = _caller(1)
        if caller.f_code is _WAITS_ALL_GATHER and (sync.direct or _called_by(sync, self, caller)):
            return None  # torch's public function: it only waits on a Work it gets (_WAITS)
        return done_work([output], sync.timeout, "all_gather_single")

    _allgather_base = all_gather_single

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """torch's layout: ``output_lists[rank][i]`` receives rank ``rank``'s ``input_list[i]``
        (one list per rank, each shaped like ``input_list``), as ``all_gather_coalesced``
        documents; ndist's ``all_gather`` of input ``i`` gets ``output_lists[r][i]`` for every r."""
        ins = _cpus(input_list, "input_list")
        size = self.size()
        if len(output_lists) != size:
            raise ValueError(f"output_lists: expected {size} lists (one per rank), got {len(output_lists)}")
        outs = [_cpus(o, f"output_lists[{r}]") for r, o in enumerate(output_lists)]
        for r, o in enumerate(outs):
            if len(o) != len(ins):
                raise ValueError(f"output_lists[{r}]: expected {len(ins)} tensors (one per input), got {len(o)}")
        g = self._nd_group
        return self._run_each("allgather_coalesced", list(output_lists), opts, nd.all_gather,
                              [([o[i] for o in outs], t, g) for i, t in enumerate(ins)])

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        outs, ins = _cpus(outputs, "outputs"), _cpus(inputs, "inputs")
        if len(outs) != len(ins):
            raise ValueError(f"inputs: expected {len(outs)} tensors (one per output), got {len(ins)}")
        g = self._nd_group
        return self._run_each("all_gather_single_coalesced", list(outputs), opts, nd.all_gather_into_tensor,
                              [(o, i, g) for o, i in zip(outs, ins)])

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_tensors, input_tensors, opts=None):
        inp = _one(input_tensors, "input_tensors")
        root = opts.rootRank
        if self.rank() == root:
            if len(output_tensors) != 1:
                raise ValueError(f"output_tensors: expected a list of 1 list of tensors on the root, "
                                 f"got {len(output_tensors)}")
            outs = _cpus(output_tensors[0], "output_tensors[0]")
        else:
            outs = None
        a = self._async(opts)
        return self._run("gather", output_tensors, a, nd.gather, inp, outs, None, self._nd_group, a, root)

    def gather_single(self, output, input, opts=None):  # noqa: A002 - torch's names
        """torch 2.14's ``dist.gather_single`` (and ``gather_into_tensor``): not offered, as by
        Gloo; said as Gloo says it (without this method torch says ``No backend type
        associated with device type cpu``). ``dist.gather`` into a list does it."""
        raise RuntimeError(f"Backend {BACKEND_NAME} does not support gather_single (use dist.gather with a "
                           f"gather_list)")

    def scatter(self, output_tensors, input_tensors, opts=None):
        out = _one(output_tensors, "output_tensors")
        root = opts.rootRank
        if self.rank() == root:
            if len(input_tensors) != 1:
                raise ValueError(f"input_tensors: expected a list of 1 list of tensors on the root, "
                                 f"got {len(input_tensors)}")
            ins = _cpus(input_tensors[0], "input_tensors[0]")
        else:
            ins = None
        a = self._async(opts)
        return self._run("scatter", output_tensors, a, nd.scatter, out, ins, None, self._nd_group, a, root)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        outs, ins = _cpus(output_tensors, "output_tensors"), _cpus(input_tensors, "input_tensors")
        a = self._async(opts)
        return self._run("alltoall", output_tensors, a, nd.all_to_all, outs, ins, self._nd_group, a)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: A002
        sync = self._nd_sync
        blocking = sync is not None and opts is not None and not opts.asyncOp
        out, inp = _two(output, input)
        # torch hands each call new lists (empty: even splits); ndist copies what it keeps
        osz = output_split_sizes or None
        isz = input_split_sizes or None
        if not blocking:
            return self._run("all_to_all_single", [output], True, nd.all_to_all_single, out, inp, osz, isz,
                             self._nd_group, True)
        try:
            nd.all_to_all_single(out, inp, osz, isz, sync.group, False)
        except DistError as exc:
            return NdistWork((), [output], sync.timeout, "all_to_all_single", error=exc)
        caller = _caller(1)
        if caller.f_code is _WAITS_ALL_TO_ALL and (sync.direct or _called_by(sync, self, caller)):
            return None  # torch's public function: it only waits on a Work it gets (_WAITS)
        return done_work([output], sync.timeout, "all_to_all_single")

    alltoall_base = all_to_all_single

    def barrier(self, opts=None):
        a = self._async(opts)
        return self._run("barrier", [], a, nd.barrier, self._nd_group, a)

    # ------------------------------------------------- point to point
    def send(self, tensors, dstRank, tag):  # noqa: N803 - torch's names
        t = _one(tensors, "tensors")
        work = nd.isend(t, group=self._nd_group, tag=tag, group_dst=dstRank)
        if self._nd_coalesced is not None:
            self._nd_coalesced.append(work)
        return NdistWork([work], tensors, self._nd_timeout, "send")

    def recv(self, tensors, srcRank, tag):  # noqa: N803
        t = _one(tensors, "tensors")
        work = nd.irecv(t, group=self._nd_group, tag=tag, group_src=srcRank)
        if self._nd_coalesced is not None:
            self._nd_coalesced.append(work)
        return NdistWork([work], tensors, self._nd_timeout, "recv")

    def recv_anysource(self, tensors, tag):
        t = _one(tensors, "tensors")
        work = nd.irecv(t, None, group=self._nd_group, tag=tag)
        return NdistWork([work], tensors, self._nd_timeout, "recv_anysource")

    # ------------------------------------------------------ coalescing
    def start_coalescing(self, device) -> None:
        """``_coalescing_manager``: the ops until ``end_coalescing`` share one Work."""
        if self._nd_coalesced is not None:
            raise ValueError("start_coalescing: this process group is already coalescing")
        self._nd_coalesced = []
        self._nd_sync = None

    def end_coalescing(self, device) -> NdistWork:
        works, self._nd_coalesced = self._nd_coalesced or [], None
        self._nd_sync = _Blocking(self._nd_group, self._nd_timeout)
        return NdistWork(works, [], self._nd_timeout, "coalesced")

    _start_coalescing = start_coalescing
    _end_coalescing = end_coalescing

    # ------------------------------------------------------- shrinking
    # torch.distributed.shrink_group (ndist/torch/_shrink.py)
    @property
    def supports_shrinking(self) -> bool:
        return _shrink.supports_shrinking(self)

    def shrink(self, ranks_to_exclude, shrink_flags=0, pg_options=None):
        return _shrink.shrink(self, ranks_to_exclude, shrink_flags, pg_options)

    def _get_backend(self, device):
        return _shrink.backend_for(self, device)

    # -------------------------------------------------------- teardown
    def shutdown(self) -> None:
        """Close the ndist backend (``destroy_process_group``); never waits on a dead peer.
        The default group's also ends the member watch, with a goodbye (``left``)."""
        self._nd_group._shutdown()
        if _watch.is_default(self._nd_group):
            _watch.close(LEFT, "it called destroy_process_group")

    def abort(self) -> None:
        self._nd_group._shutdown(abort=True)
