"""The MPI backend: every collective maps onto one MPI call on a communicator.

Blocking calls (``blocking=True``, what the public functions ask for when
``async_op=False``) use MPI's blocking collectives; otherwise the non-blocking
variant (``Iallreduce``, ``Ialltoallv``, ...) starts and an ``MPIWork`` wraps
its request. MPI's collectives take one buffer with counts, so this backend
implements the single-buffer forms (``all_to_all_single``, ``all_gather_into``,
``reduce_scatter_from``): without splits (every rank's promise of equal chunks)
they are ``MPI_Alltoall`` / ``Allgather`` / ``Reduce_scatter_block``, with
splits the v-variants. The list forms are the interface's defaults (packed
into one buffer, then the single-buffer form).
"""

from __future__ import annotations

import logging
import zlib
from itertools import accumulate
from typing import Any, Callable, Sequence

import numpy as np

from ....runtime import DistBackendError, Work
from ..._backend import DONE, Call, CollectiveBackend, array_module, unpack
from ..._intavg import truncating_divide
from ..._reduce_op import ReduceOp
from ._types import move_type, reduce_plan
from ._work import MPIWork, _as_dist_error

__all__ = ["MPIBackend"]

log = logging.getLogger("ndist.collectives.mpi")


def _is_numpy(arr) -> bool:
    return isinstance(arr, np.ndarray)


def _ptr(arr) -> int:
    if _is_numpy(arr):
        return arr.ctypes.data  # half the cost of __array_interface__'s dict
    return arr.data.ptr  # cupy




# What a blocking call returns: completed, succeeded, no outputs (shared, never mutated).
_DONE = DONE
_ndarray = np.ndarray
_PLAIN_REDUCE = (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX,
                 ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)
_SUM = ReduceOp.SUM


class _Plans(dict):
    """A table that makes a missing entry with ``make(key)`` and keeps it: the hot paths
    index it directly (one dict lookup once warm)."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[Any], Any]) -> None:
        super().__init__()
        self.make = make

    def __missing__(self, key):
        entry = self[key] = self.make(key)
        return entry


def _in_place_reduction(MPI, op: ReduceOp, dtype):
    """``(MPI.IN_PLACE, datatype, mpi_op)`` when MPI reduces ``dtype`` with ``op`` as it
    is (no staging, no division), else None."""
    if op in _PLAIN_REDUCE:
        work_dtype, mtype, mop = reduce_plan(MPI, dtype, op)
        if work_dtype == dtype:
            return MPI.IN_PLACE, mtype, mop
    return None


def _reductions(MPI, op_value):
    """dtype -> ``_in_place_reduction`` for one ReduceOp (by value: hashing the enum runs Python)."""
    op = ReduceOp(op_value)
    return _Plans(lambda dtype: _in_place_reduction(MPI, op, dtype))


def _counts_of(sizes: Sequence[int], unit: int):
    counts = [int(c) * unit for c in sizes]
    return counts, ([0, *accumulate(counts[:-1])] if counts else [])


class MPIBackend(CollectiveBackend):
    """Collectives over ``MPI_COMM_WORLD`` or a sub-communicator of it."""

    name = "mpi"

    def __init__(self, ctx, comm=None) -> None:
        super().__init__(ctx)
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = comm if comm is not None else _make_comm(MPI, ctx)
        self._cuda_aware = _cuda_aware(MPI)
        self._closed = False
        # The blocking hot paths (a NumPy buffer, nothing staged) make one MPI call from
        # plans made on first use and indexed directly: dtype -> (datatype, units per
        # element); for SUM, and per other op value, dtype -> (IN_PLACE, datatype, mpi_op)
        # when MPI reduces the dtype as it is, else None. Their buffer specs give no count
        # where mpi4py derives it from the buffer (as raw mpi4py calls do). Counted with
        # callgrind (benchmarks/mpi_overhead.py): they read the call record's fields by
        # name (a few ns each more than by index: docs/architecture.md, "The collectives layer", `Call`), and
        # call the communicator's methods bound once, loaded
        # as attributes (``f = self._x; f(...)``: a method call on an instance attribute
        # is not specialised by CPython 3.11).
        self._moves = _Plans(lambda dtype: move_type(MPI, dtype))
        self._sum = _Plans(lambda dtype: _in_place_reduction(MPI, _SUM, dtype))
        self._by_op = _Plans(lambda value: _reductions(MPI, value))
        comm = self.comm
        self._allreduce, self._bcast, self._allgather = comm.Allreduce, comm.Bcast, comm.Allgather
        self._reduce_scatter_block, self._alltoall, self._alltoallv = (
            comm.Reduce_scatter_block, comm.Alltoall, comm.Alltoallv)

    # ------------------------------------------------------------ plumbing
    def _run(self, op: str, name: str, args: tuple, blocking: bool,
             finish: Callable[[], Any] | None = None, outputs: Any = None, status=None) -> Work:
        try:
            if blocking:
                getattr(self.comm, name)(*args)
                result = finish() if finish is not None else None
                if result is None and outputs is None:
                    return _DONE  # the caller only checks it succeeded: no Future per call
                return Work.completed(op, outputs=result if result is not None else outputs)
            req = getattr(self.comm, "I" + name[0].lower() + name[1:])(*args)
            return MPIWork.for_request(op, req, finish, outputs, status)
        except Exception as err:  # noqa: BLE001 - delivered through the Work
            return Work.failed(op, _as_dist_error(op, err))

    def _host(self, arrays, post: list, out: bool):
        """Stage CuPy arrays through host memory when MPI is not CUDA-aware."""
        if not arrays or _is_numpy(arrays[0]):
            return arrays
        import cupy

        cupy.cuda.get_current_stream().synchronize()
        if self._cuda_aware:
            return arrays
        hosts = [cupy.asnumpy(a) for a in arrays]
        if out:
            post.extend(lambda d=d, h=h: d.set(h) for d, h in zip(arrays, hosts))
        return hosts

    @staticmethod
    def _finisher(steps: list):
        if not steps:
            return None

        def finish() -> None:
            for step in steps:
                step()

        return finish

    # ------------------------------------------------------------ reductions
    def _prepare_reduce(self, buf, op: ReduceOp, scale, writes: bool, post: list):
        """``(work_buf, mtype, mop)``; queues the copy back / AVG division into ``post``."""
        (buf,) = self._host([buf], post, out=writes)
        work_dtype, mtype, mop = reduce_plan(self.MPI, buf.dtype, op)
        if buf.dtype == np.bool_:
            wbuf = buf.view(np.uint8)
        elif work_dtype != buf.dtype:
            wbuf = buf.astype(work_dtype)
            if writes:
                post.insert(0, lambda: buf.__setitem__(Ellipsis, wbuf.astype(buf.dtype)))
        elif op is ReduceOp.PREMUL_SUM and not writes:
            wbuf = buf.copy()  # the caller's buffer stays unchanged
        else:
            wbuf = buf
        if op is ReduceOp.PREMUL_SUM:
            np.multiply(wbuf, scale, out=wbuf, casting="unsafe")
        if op is ReduceOp.AVG and writes:
            size = self.size
            if wbuf.dtype.kind in "iu":  # the sum in the dtype, divided toward zero (ncclAvg)
                post.insert(0, lambda: truncating_divide(wbuf, size))
            else:
                post.insert(0, lambda: np.true_divide(wbuf, size, out=wbuf, casting="unsafe"))
        return wbuf, mtype, mop

    def all_reduce(self, call: Call, *, blocking: bool = False) -> Work:
        if blocking:
            buf = call.out
            if type(buf) is _ndarray:
                # The synchronous hot path: one MPI call on the caller's buffer.
                op, dt = call.redop, call.dtype
                plan = (self._sum if op is _SUM else self._by_op[op._value_])[buf.dtype if dt is None else dt]
                if plan is not None:
                    allreduce = self._allreduce
                    try:
                        allreduce(plan[0], [buf, plan[1]], plan[2])
                    except Exception as err:  # noqa: BLE001 - delivered through the Work
                        return Work.failed("all_reduce", _as_dist_error("all_reduce", err))
                    return DONE
        buf, op = call.out, call.redop
        post: list = []
        wbuf, mtype, mop = self._prepare_reduce(buf, op, call.scale, True, post)
        return self._run("all_reduce", "Allreduce", (self.MPI.IN_PLACE, [wbuf, mtype], mop),
                         blocking, self._finisher(post))

    def reduce(self, call: Call, *, blocking: bool = False) -> Work:
        post: list = []
        dst = call.root
        root = dst == self.rank
        wbuf, mtype, mop = self._prepare_reduce(call.out, call.redop, call.scale, root, post)
        if root:
            args = (self.MPI.IN_PLACE, [wbuf, mtype], mop, dst)
        else:
            args = ([wbuf, mtype], None, mop, dst)
        return self._run("reduce", "Reduce", args, blocking, self._finisher(post))

    def reduce_scatter_from(self, call: Call, *, blocking: bool = False) -> Work:
        """One ``MPI_Reduce_scatter_block`` when every chunk has the same size (every
        rank knows every chunk's size: the same choice everywhere), else
        ``MPI_Reduce_scatter``."""
        out, inp, splits = call.out, call.inp, call.in_splits
        even = splits is None or len(set(splits)) <= 1
        if blocking and even and type(inp) is _ndarray and type(out) is _ndarray:
            op, dt = call.redop, call.dtype
            plan = (self._sum if op is _SUM else self._by_op[op._value_])[out.dtype if dt is None else dt]
            if plan is not None:
                mtype, rsb = plan[1], self._reduce_scatter_block
                try:
                    rsb([inp, mtype], [out, mtype], plan[2])
                except Exception as err:  # noqa: BLE001 - delivered through the Work
                    return Work.failed("reduce_scatter", _as_dist_error("reduce_scatter", err))
                return DONE
        op = call.redop
        post: list = []
        (inp,) = self._host([inp], post, out=False)
        # The send side is never written: _prepare_reduce copies it when it must scale or convert.
        swork, mtype, mop = self._prepare_reduce(inp, op, call.scale, False, [])
        rwork, _, _ = self._prepare_reduce(out, ReduceOp.SUM if op is ReduceOp.PREMUL_SUM else op,
                                           None, True, post)
        if even:
            return self._run("reduce_scatter", "Reduce_scatter_block", ([swork, mtype], [rwork, mtype], mop),
                             blocking, self._finisher(post))
        args = ([swork, mtype], [rwork, mtype], [int(c) for c in splits], mop)
        return self._run("reduce_scatter", "Reduce_scatter", args, blocking, self._finisher(post))

    # ---------------------------------------------------------- data movement
    def broadcast(self, call: Call, *, blocking: bool = False) -> Work:
        buf = call.out
        if blocking and type(buf) is _ndarray:
            dt, bcast = call.dtype, self._bcast
            try:  # no count: mpi4py takes the buffer's bytes over the datatype's extent
                bcast([buf, self._moves[buf.dtype if dt is None else dt][0]], call.root)
            except Exception as err:  # noqa: BLE001 - delivered through the Work
                return Work.failed("broadcast", _as_dist_error("broadcast", err))
            return DONE
        src = call.root
        post: list = []
        (buf,) = self._host([buf], post, out=self.rank != src)
        mtype, unit = move_type(self.MPI, buf.dtype)
        return self._run("broadcast", "Bcast", ([buf, buf.size * unit, mtype], src),
                         blocking, self._finisher(post))

    def all_gather_into(self, call: Call, *, blocking: bool = False) -> Work:
        """``MPI_Allgather`` when every rank contributes alike (every rank knows every
        contribution's size: the same choice everywhere), else ``MPI_Allgatherv``."""
        out, inp, splits = call.out, call.inp, call.out_splits
        even = splits is None or len(set(splits)) <= 1
        if blocking and even and type(inp) is _ndarray and type(out) is _ndarray:
            dt, allgather = call.dtype, self._allgather
            mtype = self._moves[inp.dtype if dt is None else dt][0]
            try:  # no counts: mpi4py's are the send buffer's, and the receive buffer's over the ranks
                allgather([inp, mtype], [out, mtype])
            except Exception as err:  # noqa: BLE001 - delivered through the Work
                return Work.failed("all_gather", _as_dist_error("all_gather", err))
            return DONE
        post: list = []
        (inp,) = self._host([inp], post, out=False)
        (out,) = self._host([out], post, out=True)
        mtype, unit = move_type(self.MPI, inp.dtype)
        if even:
            count = inp.size * unit
            args = ([inp, count, mtype], [out, count, mtype])
            return self._run("all_gather", "Allgather", args, blocking, self._finisher(post))
        counts, displs = _counts_of(splits, unit)
        args = ([inp, inp.size * unit, mtype], [out, counts, displs, mtype])
        return self._run("all_gather", "Allgatherv", args, blocking, self._finisher(post))

    def gather(self, call: Call, *, blocking: bool = False) -> Work:
        post: list = []
        dst = call.root
        (inp,) = self._host([call.inp], post, out=False)
        mtype, unit = move_type(self.MPI, inp.dtype)
        rspec = None
        if self.rank == dst:
            outputs = call.outputs
            flat = array_module(outputs[0]).empty(sum(a.size for a in outputs), inp.dtype)
            (rbuf,) = self._host([flat], post, out=True)
            post.append(lambda: unpack(flat, outputs))
            counts, displs = _counts_of([a.size for a in outputs], unit)
            rspec = [rbuf, counts, displs, mtype]
        args = ([inp, inp.size * unit, mtype], rspec, dst)
        return self._run("gather", "Gatherv", args, blocking, self._finisher(post))

    def scatter(self, call: Call, *, blocking: bool = False) -> Work:
        post: list = []
        src = call.root
        (out,) = self._host([call.out], post, out=True)
        mtype, unit = move_type(self.MPI, out.dtype)
        sspec = None
        if self.rank == src:
            inputs = call.inputs
            flat = array_module(inputs[0]).concatenate([a.reshape(-1) for a in inputs])
            (sbuf,) = self._host([flat], post, out=False)
            counts, displs = _counts_of([a.size for a in inputs], unit)
            sspec = [sbuf, counts, displs, mtype]
        args = (sspec, [out, out.size * unit, mtype], src)
        return self._run("scatter", "Scatterv", args, blocking, self._finisher(post))

    def all_to_all_single(self, call: Call, *, blocking: bool = False) -> Work:
        """``MPI_Alltoall`` without splits (every rank's promise of equal chunks: the
        same choice everywhere), else ``MPI_Alltoallv``."""
        out, inp, osplits, isplits = call.out, call.inp, call.out_splits, call.in_splits
        even = isplits is None and osplits is None
        if blocking and type(inp) is _ndarray and type(out) is _ndarray:
            dt = call.dtype
            mtype, unit = self._moves[inp.dtype if dt is None else dt]
            try:
                if even:  # no counts: mpi4py splits both buffers over the ranks
                    alltoall = self._alltoall
                    alltoall([inp, mtype], [out, mtype])
                    return DONE
                if unit == 1 and isplits is not None and osplits is not None:
                    # counts in elements as they are; no displacements: mpi4py packs the blocks
                    alltoallv = self._alltoallv
                    alltoallv([inp, isplits, None, mtype], [out, osplits, None, mtype])
                    return DONE
            except Exception as err:  # noqa: BLE001 - delivered through the Work
                return Work.failed("all_to_all", _as_dist_error("all_to_all", err))
        post: list = []
        (inp,) = self._host([inp], post, out=False)
        (out,) = self._host([out], post, out=True)
        mtype, unit = move_type(self.MPI, inp.dtype)
        if even:
            count = inp.size // self.size * unit
            args = ([inp, count, mtype], [out, count, mtype])
            return self._run("all_to_all", "Alltoall", args, blocking, self._finisher(post))
        n = self.size
        scounts, sdispls = _counts_of(call.in_splits or [inp.size // n] * n, unit)
        rcounts, rdispls = _counts_of(call.out_splits or [out.size // n] * n, unit)
        args = ([inp, scounts, sdispls, mtype], [out, rcounts, rdispls, mtype])
        return self._run("all_to_all", "Alltoallv", args, blocking, self._finisher(post))

    def barrier(self, call: Call, *, blocking: bool = False) -> Work:
        return self._run("barrier", "Barrier", (), blocking)

    # ---------------------------------------------------------- point to point
    def send(self, call: Call, *, blocking: bool = False) -> Work:
        post: list = []
        (buf,) = self._host([call.out], post, out=False)
        mtype, unit = move_type(self.MPI, buf.dtype)
        return self._run("send", "Send", ([buf, buf.size * unit, mtype], call.root, call.tag), blocking)

    def recv(self, call: Call, *, blocking: bool = False) -> Work:
        post: list = []
        (buf,) = self._host([call.out], post, out=True)
        mtype, unit = move_type(self.MPI, buf.dtype)
        status = self.MPI.Status()
        src, tag = call.root, call.tag
        source = self.MPI.ANY_SOURCE if src is None else src

        def finish():
            for step in post:
                step()
            return [status.Get_source()]

        if blocking:
            try:
                self.comm.Recv([buf, buf.size * unit, mtype], source, tag, status)
                return Work.completed("recv", outputs=finish())
            except Exception as err:  # noqa: BLE001
                return Work.failed("recv", _as_dist_error("recv", err))
        try:
            req = self.comm.Irecv([buf, buf.size * unit, mtype], source, tag)
        except Exception as err:  # noqa: BLE001
            return Work.failed("recv", _as_dist_error("recv", err))
        return MPIWork.for_request("recv", req, finish, None, status)

    # -------------------------------------------------------------- lifetime
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        MPI = self.MPI
        try:
            if not MPI.Is_finalized() and self.comm not in (MPI.COMM_WORLD, MPI.COMM_NULL):
                self.comm.Free()
        except Exception:  # noqa: BLE001 - close must not raise
            log.debug("freeing the communicator of %r failed", self, exc_info=True)


def _cuda_aware(MPI) -> bool:
    query = getattr(MPI, "Query_cuda_support", None)
    if query is None:
        return False
    try:
        return bool(query())
    except Exception:  # noqa: BLE001
        return False


def _make_comm(MPI, ctx):
    world = MPI.COMM_WORLD
    wsize = world.Get_size()
    granks = tuple(ctx.global_ranks)
    if not granks or max(granks) >= wsize:
        raise DistBackendError(
            f"mpi: group {ctx.group_name!r} spans global ranks {list(granks)} but MPI_COMM_WORLD has "
            f"{wsize} process(es); the mpi backend needs the job launched by mpiexec/mpirun/srun "
            f"with one MPI process per rank"
        )
    if granks == tuple(range(wsize)):
        comm = world.Dup()
    else:
        group = world.Get_group()
        sub = group.Incl(list(granks))
        try:
            tag = zlib.crc32(ctx.group_name.encode()) % 32768
            comm = world.Create_group(sub, tag)
        finally:
            sub.Free()
            group.Free()
    if comm.Get_rank() != ctx.rank or comm.Get_size() != ctx.size:
        raise DistBackendError(
            f"mpi: group {ctx.group_name!r}: ndist rank {ctx.rank}/{ctx.size} is MPI rank "
            f"{comm.Get_rank()}/{comm.Get_size()}; ndist's ranks must be MPI_COMM_WORLD's"
        )
    return comm
