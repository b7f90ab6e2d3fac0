"""``ProcessGroupNdist``: a torch ``ProcessGroup`` implemented in Python over an
ndist process group.

torch calls one method per op with its own argument shapes (lists of tensors,
``*Options`` structs with group ranks); each method maps that onto ndist's
public collectives (``ndist.distributed``), which take torch CPU tensors
zero-copy (``tensor.numpy()`` views; non-contiguous outputs are staged and
written back). Ranks in ``opts.rootRank`` / ``dstRank`` / ``srcRank`` are
group ranks, passed on as ``group_src`` / ``group_dst``.

When torch will wait right away (``opts.asyncOp`` is False: a public
function called without ``async_op``), the op runs synchronously in ndist
(inline on the caller's thread) and the Work returned is already complete;
otherwise (``async_op=True``, DDP's reducer, functional collectives) ndist
runs it in the background and the Work completes with it.
"""

from __future__ import annotations

import atexit
import logging
import weakref
from datetime import timedelta
from typing import Any, Callable, Sequence

import torch
import torch.distributed as tdist

from .. import distributed as nd
from ..runtime import DistError
from ..runtime import ProcessGroup as NdistGroup
from ._work import NdistWork

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


def _reduce_op(op) -> Any:
    """torch's ``ReduceOp`` (or its ``RedOpType``) -> ndist's."""
    kind = getattr(op, "op", op)
    ours = _REDUCE_OPS.get(kind)
    if ours is not None:
        return ours
    if kind == _RED.PREMUL_SUM:
        factor = op.factor
        if isinstance(factor, torch.Tensor):
            factor = factor.item()
        return nd._make_nccl_premul_sum(factor)
    raise ValueError(f"op: expected a torch.distributed.ReduceOp, got {op!r}")


def _one(tensors: Sequence[torch.Tensor], name: str) -> torch.Tensor:
    """The single tensor of torch's one-element lists (one device per process)."""
    if len(tensors) != 1:
        raise ValueError(f"{name}: expected a list of 1 tensor (the ndist backend takes one tensor per "
                         f"process), got {len(tensors)}")
    return _cpu(tensors[0], f"{name}[0]")


def _cpu(t: torch.Tensor, name: str) -> torch.Tensor:
    if t.device.type != "cpu":
        raise ValueError(f"{name}: expected a CPU tensor (backend {BACKEND_NAME!r} serves 'cpu'), "
                         f"got one on {t.device}")
    if t.layout != torch.strided:
        raise ValueError(f"{name}: expected a dense (strided) tensor, got layout {t.layout}")
    return t


def _cpus(tensors: Sequence[torch.Tensor], name: str) -> list[torch.Tensor]:
    return [_cpu(t, f"{name}[{i}]") for i, t in enumerate(tensors)]


def _async(opts: Any) -> bool:
    return bool(getattr(opts, "asyncOp", True)) if opts is not None else True


class ProcessGroupNdist(tdist.ProcessGroup):
    """A torch process group whose collectives run on an ndist process group.

    ``store`` is an ndist Store (torch's, wrapped), ``rank`` / ``size`` the
    group rank and size, ``global_ranks`` the torch global ranks of the group
    (the mpi engine needs them to be ``MPI_COMM_WORLD``'s), ``engine`` the
    ndist backend (``"socket"`` or ``"mpi"``).
    """

    def __init__(self, store, rank: int, size: int, timeout: timedelta, group_name: str,
                 global_ranks: Sequence[int] = (), engine: str = "socket", options: Any = None) -> None:
        super().__init__(rank, size)
        ranks = tuple(global_ranks) or tuple(range(size))
        if len(ranks) != size:
            raise ValueError(f"global_ranks: expected {size} ranks (the group size), got {list(global_ranks)}")
        self._nd_timeout = timeout.total_seconds()
        self._nd_engine = engine
        self._nd_coalesced: list | None = None
        self._nd_name, self._nd_desc = group_name, ""
        self._nd_group = NdistGroup(ranks, ranks[rank], f"torch-{group_name}", store, {"cpu": engine}, timeout,
                                 options)
        # Created now, not on the first op: every rank builds its backend during
        # init_process_group / new_group (the mpi engine's communicator creation is
        # collective), and a peer that cannot be reached fails here.
        self._nd_group.backend_for("cpu")
        _live.add(self)
        log.info("torch process group %r: ndist %s backend, rank %d of %d", group_name, engine, rank, size)

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
    def engine(self) -> str:
        return self._nd_engine

    def __repr__(self) -> str:
        return f"<ProcessGroupNdist rank={self.rank()} size={self.size()} engine={self._nd_engine!r}>"

    # --------------------------------------------------------- plumbing
    def _run(self, op: str, call: Callable[[bool], Any], outputs: list, opts: Any = None) -> NdistWork:
        """Run ``call(async_op)``; the Work torch gets back.

        Synchronous calls that fail return a failed Work (torch raises from
        ``wait()``); bad arguments raise here, before anything was sent.
        """
        if _async(opts) or self._nd_coalesced is not None:
            work = call(True)
            if self._nd_coalesced is not None:
                self._nd_coalesced.append(work)
            return NdistWork([work], outputs, self._nd_timeout, op)
        try:
            call(False)
        except DistError as exc:
            return NdistWork([], outputs, self._nd_timeout, op, error=exc)
        return NdistWork([], outputs, self._nd_timeout, op)

    def _run_each(self, op: str, calls: list[Callable[[bool], Any]], outputs: list, opts: Any = None) -> NdistWork:
        """Several ops of one torch call (the coalesced forms): issued back to back, one Work."""
        works = [call(True) for call in calls]
        if self._nd_coalesced is not None:
            self._nd_coalesced.extend(works)
        work = NdistWork(works, outputs, self._nd_timeout, op)
        if not _async(opts) and self._nd_coalesced is None:
            try:
                work.wait()
            except tdist.DistError as err:
                return NdistWork([], outputs, self._nd_timeout, op, error=err)
        return work

    # ----------------------------------------------------- reductions
    def allreduce(self, tensors, opts=None):
        t = _one(tensors, "tensors")
        op = _reduce_op(opts.reduceOp) if opts is not None else nd.ReduceOp.SUM
        return self._run("allreduce", lambda a: nd.all_reduce(t, op, group=self._nd_group, async_op=a), tensors, opts)

    def allreduce_coalesced(self, tensors, opts=None):
        ts = _cpus(tensors, "tensors")
        op = _reduce_op(opts.reduceOp) if opts is not None else nd.ReduceOp.SUM
        calls = [lambda a, t=t: nd.all_reduce(t, op, group=self._nd_group, async_op=a) for t in ts]
        return self._run_each("allreduce_coalesced", calls, tensors, opts)

    def reduce(self, tensors, opts=None):
        t = _one(tensors, "tensors")
        op = _reduce_op(opts.reduceOp)
        root = opts.rootRank
        return self._run("reduce", lambda a: nd.reduce(t, op=op, group=self._nd_group, async_op=a, group_dst=root),
                         tensors, opts)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        out = _one(output_tensors, "output_tensors")
        if len(input_tensors) != 1:
            raise ValueError(f"input_tensors: expected a list of 1 list of tensors, got {len(input_tensors)}")
        ins = _cpus(input_tensors[0], "input_tensors[0]")
        op = _reduce_op(opts.reduceOp)
        return self._run("reduce_scatter",
                         lambda a: nd.reduce_scatter(out, ins, op=op, group=self._nd_group, async_op=a),
                         output_tensors, opts)

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002 - torch's names
        out, inp = _cpu(output, "output"), _cpu(input, "input")
        op = _reduce_op(opts.reduceOp)
        return self._run("reduce_scatter_single",
                         lambda a: nd.reduce_scatter_tensor(out, inp, op=op, group=self._nd_group, async_op=a),
                         [output], opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        outs, ins = _cpus(outputs, "outputs"), _cpus(inputs, "inputs")
        if len(outs) != len(ins):
            raise ValueError(f"inputs: expected {len(outs)} tensors (one per output), got {len(ins)}")
        op = _reduce_op(opts.reduceOp)
        calls = [lambda a, o=o, i=i: nd.reduce_scatter_tensor(o, i, op=op, group=self._nd_group, async_op=a)
                 for o, i in zip(outs, ins)]
        return self._run_each("reduce_scatter_single_coalesced", calls, list(outputs), opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -------------------------------------------------- data movement
    def broadcast(self, tensors, opts=None):
        t = _one(tensors, "tensors")
        root = opts.rootRank if opts is not None else 0
        return self._run("broadcast", lambda a: nd.broadcast(t, group=self._nd_group, async_op=a, group_src=root),
                         tensors, opts)

    def allgather(self, output_tensors, input_tensors, opts=None):
        inp = _one(input_tensors, "input_tensors")
        if len(output_tensors) != 1:
            raise ValueError(f"output_tensors: expected a list of 1 list of tensors, got {len(output_tensors)}")
        outs = _cpus(output_tensors[0], "output_tensors[0]")
        return self._run("allgather", lambda a: nd.all_gather(outs, inp, group=self._nd_group, async_op=a),
                         output_tensors, opts)

    def all_gather_single(self, output, input, opts=None):  # noqa: A002
        out, inp = _cpu(output, "output"), _cpu(input, "input")
        return self._run("all_gather_single",
                         lambda a: nd.all_gather_into_tensor(out, inp, group=self._nd_group, async_op=a), [output], opts)

    _allgather_base = all_gather_single

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        ins = _cpus(input_list, "input_list")
        if len(output_lists) != len(ins):
            raise ValueError(f"output_lists: expected {len(ins)} lists (one per input), got {len(output_lists)}")
        outs = [_cpus(o, f"output_lists[{i}]") for i, o in enumerate(output_lists)]
        calls = [lambda a, o=o, i=i: nd.all_gather(o, i, group=self._nd_group, async_op=a) for o, i in zip(outs, ins)]
        return self._run_each("allgather_coalesced", calls, list(output_lists), opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        outs, ins = _cpus(outputs, "outputs"), _cpus(inputs, "inputs")
        if len(outs) != len(ins):
            raise ValueError(f"inputs: expected {len(outs)} tensors (one per output), got {len(ins)}")
        calls = [lambda a, o=o, i=i: nd.all_gather_into_tensor(o, i, group=self._nd_group, async_op=a)
                 for o, i in zip(outs, ins)]
        return self._run_each("all_gather_single_coalesced", calls, list(outputs), opts)

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
        return self._run("gather", lambda a: nd.gather(inp, outs, group=self._nd_group, async_op=a, group_dst=root),
                         output_tensors, opts)

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
        return self._run("scatter", lambda a: nd.scatter(out, ins, group=self._nd_group, async_op=a, group_src=root),
                         output_tensors, opts)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        outs, ins = _cpus(output_tensors, "output_tensors"), _cpus(input_tensors, "input_tensors")
        return self._run("alltoall", lambda a: nd.all_to_all(outs, ins, group=self._nd_group, async_op=a),
                         output_tensors, opts)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: A002
        out, inp = _cpu(output, "output"), _cpu(input, "input")
        osz = list(output_split_sizes) or None
        isz = list(input_split_sizes) or None
        return self._run("all_to_all_single",
                         lambda a: nd.all_to_all_single(out, inp, osz, isz, group=self._nd_group, async_op=a),
                         [output], opts)

    alltoall_base = all_to_all_single

    def barrier(self, opts=None):
        return self._run("barrier", lambda a: nd.barrier(group=self._nd_group, async_op=a), [], opts)

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

    def end_coalescing(self, device) -> NdistWork:
        works, self._nd_coalesced = self._nd_coalesced or [], None
        return NdistWork(works, [], self._nd_timeout, "coalesced")

    _start_coalescing = start_coalescing
    _end_coalescing = end_coalescing

    # -------------------------------------------------------- teardown
    def shutdown(self) -> None:
        """Close the ndist backend (``destroy_process_group``); never waits on a dead peer."""
        self._nd_group._shutdown()

    def abort(self) -> None:
        self._nd_group._shutdown(abort=True)
