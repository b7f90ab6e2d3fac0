"""NcclBackend: collectives on CuPy arrays through ``cupy.cuda.nccl``.

Every operation is enqueued on the *current* CuPy stream and returns a
``CudaWork`` (see ``_work.py``). Reductions follow ``_plan.py``; data movement
moves bytes, so every dtype can be broadcast, gathered, scattered or sent.
Uneven all_gather / gather / scatter / all_to_all run as grouped
``ncclSend``/``ncclRecv`` (zero-byte pieces skipped, the rank's own piece
copied on the device); uneven reduce_scatter runs as grouped ``ncclReduce``.

NCCL point-to-point has no tags: ``tag`` is accepted and ignored between
different ranks (messages between two ranks match in issue order); sends to
oneself are buffered on the device and matched by tag. Receiving from any
source is not possible with NCCL and raises ``NotImplementedError``.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from ....runtime import BackendContext, DistBackendError, Work
from ..._backend import DONE, Call, CollectiveBackend, Op, split_views
from ..._capture import capture_error, op_refusal
from ..._intavg import truncating_divide
from ..._reduce_op import ReduceOp
from . import _plan
from ._comm import communicator_device, exchange_unique_id, init_communicator
from ._events import EventPool
from ._work import CapturedWork, CudaWork, Watchdog, settle_at_close, unfinished

__all__ = ["NcclBackend"]

log = logging.getLogger("ndist.collectives.nccl")

_D2D = 3  # cudaMemcpyDeviceToDevice


def _capturing(stream: Any) -> bool:
    """``stream`` is being captured into a CUDA graph (the legacy default stream, ptr 0, never is)."""
    return bool(stream.ptr) and stream.is_capturing()


class NcclBackend(CollectiveBackend):
    name = "nccl"
    coalesces = True  # coalescing(): one NCCL group (batch_isend_irecv)

    def __init__(self, ctx: BackendContext) -> None:
        super().__init__(ctx)
        import cupy
        from cupy.cuda import nccl

        self._cp = cupy
        self._nccl = nccl
        self._check_abi(nccl)
        dev = communicator_device(ctx)
        self._device = cupy.cuda.Device(dev) if dev is not None else cupy.cuda.Device()
        self._dev_id = self._device.id
        self._version = nccl.get_version()
        self._timeout_s = ctx.timeout.total_seconds()
        self._fatal: BaseException | None = None
        self._closed = False
        self._seq = 0
        self._plans: dict[tuple[Any, ReduceOp], _plan.ReductionPlan] = {}
        self._self_queue: dict[int, list] = {}  # tag -> device copies sent to self
        self._coalesced: list | None = None  # works issued inside ``coalescing()``
        # what ops recorded into CUDA graphs still need (temporaries the graph reads or writes
        # at each replay): kept until the backend closes, as the graphs may be replayed until then
        self._captured_keep: list = []
        raw = exchange_unique_id(ctx, nccl.get_unique_id)
        with self._device:
            try:
                self._comm = init_communicator(nccl, self.size, raw, self.rank)
            except nccl.NcclError as err:
                raise DistBackendError(f"nccl: communicator init failed on rank {self.rank} of group "
                                       f"{ctx.group_name!r} (device {self._dev_id}): {err}") from err
        self._watchdog = Watchdog(f"group {ctx.group_name!r} rank {self.rank}",
                                  lambda: cupy.cuda.Device(self._dev_id), self._async_error, self._abort_comm)
        Event = cupy.cuda.Event
        self._events = EventPool(lambda: Event(block=False, disable_timing=True))
        log.info("nccl %s: rank %d/%d on device %d (NCCL %d)", ctx.group_name, self.rank, self.size,
                 self._dev_id, self._version)

    @staticmethod
    def _check_abi(nccl: Any) -> None:
        expected = {"NCCL_UINT8": _plan.UINT8, "NCCL_FLOAT32": _plan.FLOAT32, "NCCL_SUM": _plan.SUM,
                    "NCCL_MIN": _plan.MIN, "NCCL_AVG": _plan.AVG}
        for name, value in expected.items():
            got = getattr(nccl, name, value)
            if got != value:
                raise DistBackendError(f"nccl: cupy.cuda.nccl.{name} is {got}, expected {value}")

    # ------------------------------------------------------------ plumbing
    def _async_error(self) -> BaseException | None:
        if self._fatal is not None:
            return self._fatal
        if self._closed:
            return None  # closed cleanly: the work had finished
        try:
            self._comm.check_async_error()
        except self._nccl.NcclError as err:
            return DistBackendError(f"nccl: asynchronous error on rank {self.rank} of group "
                                    f"{self.ctx.group_name!r}: {err} (a peer may have failed)")
        return None

    def _abort_comm(self, exc: BaseException) -> None:
        """Record the fatal error and abort the communicator (any thread; idempotent).

        The communicator object stays: CuPy's ``abort()`` nulls its handle, so
        a racing call on another thread gets an NcclError, not a crash.
        """
        if self._fatal is None:
            self._fatal = exc
        try:
            with self._device:
                self._comm.abort()
        except Exception:  # noqa: BLE001 - already failing
            log.debug("ncclCommAbort failed", exc_info=True)

    def _check_usable(self, op: str) -> None:
        if self._closed:
            raise DistBackendError(f"nccl {op}: the backend of group {self.ctx.group_name!r} is closed")
        if self._fatal is not None:
            raise DistBackendError(f"nccl {op}: the communicator of group {self.ctx.group_name!r} was "
                                   f"aborted after an earlier failure: {self._fatal}") from self._fatal

    def _array(self, a: Any, name: str) -> Any:
        if not isinstance(a, self._cp.ndarray):
            raise TypeError(f"{name}: the nccl backend needs CUDA (CuPy) arrays, got {type(a).__module__}."
                            f"{type(a).__name__}")
        if a.device.id != self._dev_id:
            raise ValueError(f"{name}: expected an array on cuda:{self._dev_id} (this rank's NCCL device), "
                             f"got one on cuda:{a.device.id}")
        return a

    def _plan(self, dtype: Any, op: ReduceOp) -> _plan.ReductionPlan:
        key = (dtype, op)  # not dtype.name: NumPy computes that in Python on every access
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = _plan.reduction_plan(dtype.name, op, self._version)
        return plan

    def _launch(self, op: str, body, outputs: Any = None, keepalive: Any = None, blocking: bool = False) -> Work:
        """Run ``body(stream_ptr)`` on the current stream of this rank's device; return its Work.

        ``body`` does all device work of the operation (temporaries, NCCL calls,
        post-steps) and returns what must stay alive until the GPU is done.
        ``blocking`` (``async_op=False``: nobody keeps the Work): return ``DONE``
        once enqueued, with the event alone given to the watchdog (as torch, a
        synchronous call returns after the enqueue; the watchdog enforces the
        group timeout). On a stream being captured into a CUDA graph the op is
        recorded (``_capture.py``): a ``CapturedWork``, or ``DONE``.
        """
        self._check_usable(op)
        if self._coalesced is not None and op not in ("send", "recv"):
            # Device steps of collectives (casts, copies) would run before the grouped NCCL call.
            raise RuntimeError(f"nccl {op}: only send and recv may be issued inside a coalescing block")
        self._seq += 1
        seq = self._seq
        cp = self._cp
        switch = cp.cuda.runtime.getDevice() != self._dev_id
        if switch:
            self._device.__enter__()
        try:
            stream = cp.cuda.get_current_stream()
            # (the legacy default stream, ptr 0, cannot be captured: no query for it)
            if stream.ptr and stream.is_capturing():
                return self._launch_captured(op, seq, body, stream, outputs, keepalive, blocking and not switch)
            # The group timeout holds from here: the enqueue can block (NCCL connects lazily).
            self._watchdog.enter_call(op, seq, self._timeout_s)
            try:
                extra = body(stream.ptr)
            except self._nccl.NcclError as err:
                exc = self._fatal or DistBackendError(f"nccl {op} (#{seq}) failed on rank {self.rank} of group "
                                                      f"{self.ctx.group_name!r}: {err}")
                self._abort_comm(exc)
                self._watchdog.fail_all(exc)
                return Work.failed(op, exc, seq)
            finally:
                self._watchdog.leave_call()
            if self._fatal is not None:  # aborted while the call blocked (an aborted call may return success)
                self._watchdog.fail_all(self._fatal)
                return Work.failed(op, self._fatal, seq)
            if self._coalesced is not None:
                # Inside an NCCL group nothing is launched before groupEnd: the event
                # is recorded when the coalescing block closes.
                work = CudaWork(op, seq, None, self._async_error, outputs)
                self._coalesced.append((work, (keepalive, extra)))
                return work
            events = self._events
            event = events.acquire()
            event.record(stream)
        finally:
            if switch:
                self._device.__exit__(None, None, None)
        if blocking and not switch:
            # (after a device switch the caller's stream is another device's: it gets a Work,
            # whose wait() makes that stream wait on the event)
            self._watchdog.add_event(op, seq, event, self._timeout_s, (keepalive, extra), stream, events)
            return DONE
        work = CudaWork(op, seq, event, self._async_error, outputs)
        self._watchdog.add(work, self._timeout_s, (keepalive, extra), stream, events)
        return work

    def _launch_captured(self, op: str, seq: int, body, stream, outputs: Any, keepalive: Any,
                         blocking: bool) -> Work:
        """``_launch`` on a stream being captured: ``body`` records into the graph.

        Nothing is given to the watchdog (the op runs at each replay, and its
        event must not be queried); the temporaries live until ``close()``.
        """
        why = op_refusal(op, staged=False)
        if why is not None:
            raise capture_error(f"nccl {op}", seq, "the op", why)
        try:
            extra = body(stream.ptr)
        except self._nccl.NcclError as err:
            raise DistBackendError(f"nccl {op} (#{seq}) could not be recorded into a CUDA graph on rank "
                                   f"{self.rank} of group {self.ctx.group_name!r}: {err}") from err
        self._captured_keep.append((keepalive, extra))
        if blocking:
            return DONE
        event = self._cp.cuda.Event(block=False, disable_timing=True)  # a dependency inside the graph
        event.record(stream)
        return CapturedWork(op, seq, event, outputs)

    @contextlib.contextmanager
    def coalescing(self):
        """Issue the operations of the block as one NCCL group (``ncclGroupStart/End``).

        What ``batch_isend_irecv`` needs: sends and receives between the same
        ranks in one group cannot deadlock each other. Only send and recv are
        allowed inside (as for torch's batch_isend_irecv). The block's Works
        share one event, recorded on the current stream after ``groupEnd``;
        waiting on one of them inside the block is an error.
        """
        if self._coalesced is not None:
            raise RuntimeError("nccl coalescing: blocks cannot be nested")
        self._check_usable("coalescing")
        cp, nccl = self._cp, self._nccl
        with self._device:
            if _capturing(cp.cuda.get_current_stream()):
                raise capture_error("nccl coalescing", None, "a coalescing block", op_refusal("coalescing", staged=False))
            self._coalesced = []
            nccl.groupStart()
            try:
                yield self
            finally:
                works, self._coalesced = self._coalesced, None
                self._watchdog.enter_call(f"coalesced group of {len(works)} ops", self._seq, self._timeout_s)
                try:
                    nccl.groupEnd()  # launches the block: may block connecting to peers, like _launch
                    err = None
                except nccl.NcclError as raised:
                    err = raised
                finally:
                    self._watchdog.leave_call()
                if err is not None or (self._fatal is not None and not self._closed):
                    exc = self._fatal or DistBackendError(f"nccl coalesced group of {len(works)} ops failed on rank "
                                                          f"{self.rank} of group {self.ctx.group_name!r}: {err}")
                    self._abort_comm(exc)
                    for work, _ in works:
                        work.fail(exc)
                    self._watchdog.fail_all(exc)
                    raise exc from err
                # Also when the block raised: what it issued was launched by groupEnd.
                # Deferred write-backs (then) go on the stream after it, before the event.
                if not self._closed:  # close() inside the block failed its works (settle_at_close)
                    tracked = []
                    for work, keep in works:
                        tracked.append((work, keep))
                        tracked.extend((chained, None) for chained in work.run_deferred())
                    event = cp.cuda.Event(block=False, disable_timing=True)
                    stream = cp.cuda.get_current_stream()
                    event.record(stream)
                    for work, keep in tracked:
                        work._event = event
                        self._watchdog.add(work, self._timeout_s, keep, stream)

    def _copy(self, dst: Any, src: Any, stream_ptr: int) -> None:
        if src.nbytes:
            self._cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes, _D2D, stream_ptr)

    def _grouped_p2p(self, sends, recvs, stream_ptr: int) -> None:
        """One NCCL group of sends ``[(array, peer)]`` and receives; pieces for self are copied."""
        nccl, comm = self._nccl, self._comm
        nccl.groupStart()
        try:
            for a, peer in sends:
                if a.nbytes:
                    comm.send(a.data.ptr, a.nbytes, _plan.BYTES, peer, stream_ptr)
            for a, peer in recvs:
                if a.nbytes:
                    comm.recv(a.data.ptr, a.nbytes, _plan.BYTES, peer, stream_ptr)
        finally:
            nccl.groupEnd()

    # ------------------------------------------------------------ reductions
    def _scale(self, scale: Any) -> Any:
        if scale is None:
            raise ValueError("scale: PREMUL_SUM needs a factor, got None")
        data = getattr(scale, "_data", scale)  # an ndist.Tensor
        if isinstance(data, self._cp.ndarray):
            return data
        if hasattr(data, "item") and getattr(data, "size", 1) == 1:
            return data.item()
        if isinstance(data, (int, float, complex)) and not isinstance(data, bool):
            return data
        raise TypeError(f"scale: expected a number or a one-element tensor, got {type(scale).__name__}")

    def _nccl_view(self, plan: _plan.ReductionPlan, a: Any) -> Any:
        """``a`` as NCCL reduces it: itself, a reinterpreting view, or an upcast copy."""
        if plan.view == "same":
            return a
        if plan.view == "reinterpret":
            return a.reshape(-1).view(plan.work_dtype)
        return a.astype(plan.work_dtype)

    def _reduction_buffers(self, plan, buf, scale):
        """(send, recv) NCCL buffers for reducing ``buf`` in place (send may be a scaled copy)."""
        recv = self._nccl_view(plan, buf)
        send = recv
        if plan.premul:
            factor = self._scale(scale)
            if plan.view == "upcast":
                send = (recv * factor).astype(recv.dtype, copy=False)
            else:
                send = self._nccl_view(plan, (buf * factor).astype(buf.dtype, copy=False))
        return send, recv

    def _finish(self, plan, buf, recv) -> None:
        """Post-steps on the stream: casting an upcast result back, AVG emulation."""
        if plan.view == "upcast":
            self._cp.copyto(buf, recv, casting="unsafe")
            recv = buf  # an upcast integer's AVG divides the sum wrapped back into its dtype
        if plan.divide:
            if recv.dtype.kind in "iu":
                truncating_divide(recv, self.size)
            else:
                self._cp.true_divide(recv, self.size, out=recv)

    def all_reduce(self, call: Call, *, blocking: bool = False) -> Work:
        buf, op, scale = call.out, call.redop, call.scale
        self._array(buf, "tensor")
        plan = self._plan(buf.dtype, op)
        if plan.premul:
            self._scale(scale)  # bad factors fail before anything is enqueued

        def body(stream):
            if not buf.size:
                return None
            send, recv = self._reduction_buffers(plan, buf, scale)
            self._comm.allReduce(send.data.ptr, recv.data.ptr, recv.size, plan.nccl_dtype, plan.nccl_op, stream)
            self._finish(plan, buf, recv)
            return send, recv

        return self._launch("all_reduce", body, blocking=blocking)

    def reduce(self, call: Call, *, blocking: bool = False) -> Work:
        buf, dst, op, scale = call.out, call.root, call.redop, call.scale
        self._array(buf, "tensor")
        plan = self._plan(buf.dtype, op)
        if plan.premul:
            self._scale(scale)

        def body(stream):
            if not buf.size:
                return None
            # Off the root NCCL reads ``send`` only, so ``buf`` stays unchanged there
            # (a scaled or upcast input is a temporary).
            send, recv = self._reduction_buffers(plan, buf, scale)
            self._comm.reduce(send.data.ptr, recv.data.ptr, recv.size, plan.nccl_dtype, plan.nccl_op, dst, stream)
            if self.rank == dst:
                self._finish(plan, buf, recv)
            return send, recv

        return self._launch("reduce", body, blocking=blocking)

    def reduce_scatter_from(self, call: Call, *, blocking: bool = False) -> Work:
        """Equal chunks: one ncclReduceScatter on the caller's buffers; else the list form."""
        if call.in_splits is not None and len(set(call.in_splits)) > 1:
            return self.reduce_scatter(call._replace(op=Op.REDUCE_SCATTER, inp=None, in_splits=None,
                                                     inputs=split_views(call.inp, call.in_splits, self.size)),
                                       blocking=blocking)
        return self._reduce_scatter_flat(call.out, call.inp, call.redop, call.scale, blocking=blocking)

    def reduce_scatter(self, call: Call, *, blocking: bool = False) -> Work:
        out, inputs, op, scale = call.out, call.inputs, call.redop, call.scale
        self._array(out, "output")
        for i, a in enumerate(inputs):
            self._array(a, f"input_list[{i}]")
        if all(a.nbytes == out.nbytes for a in inputs):
            return self._reduce_scatter_flat(out, None, op, scale, inputs, blocking=blocking)
        plan = self._plan(out.dtype, op)
        if plan.premul:
            self._scale(scale)

        def body_uneven(stream):
            # One ncclReduce per destination rank, all in one NCCL group.
            recv = self._nccl_view(plan, out)
            sends = [self._reduction_buffers(plan, a, scale)[0] for a in inputs]
            nccl, comm = self._nccl, self._comm
            nccl.groupStart()
            try:
                for root, send in enumerate(sends):
                    if send.size:
                        target = recv if root == self.rank else send  # recvbuff is only used on the root
                        comm.reduce(send.data.ptr, target.data.ptr, send.size, plan.nccl_dtype, plan.nccl_op,
                                    root, stream)
            finally:
                nccl.groupEnd()
            if recv.size:
                self._finish(plan, out, recv)
            return sends, recv

        return self._launch("reduce_scatter", body_uneven, blocking=blocking)

    def _reduce_scatter_flat(self, out, flat_in, op, scale, inputs=None, blocking: bool = False) -> Work:
        """ncclReduceScatter of ``flat_in`` (or of ``inputs`` packed) into ``out``."""
        self._array(out, "output")
        if flat_in is not None:
            self._array(flat_in, "input")
        plan = self._plan(out.dtype, op)
        if plan.premul:
            self._scale(scale)

        def body(stream):
            if not out.size:
                return None
            flat = flat_in
            if flat is None:
                flat = self._cp.concatenate([a.reshape(-1) for a in inputs])
            send, _ = self._reduction_buffers(plan, flat, scale)
            recv = self._nccl_view(plan, out)
            self._comm.reduceScatter(send.data.ptr, recv.data.ptr, recv.size, plan.nccl_dtype, plan.nccl_op,
                                     stream)
            self._finish(plan, out, recv)
            return flat, send, recv

        return self._launch("reduce_scatter", body, blocking=blocking)

    # ---------------------------------------------------------- data movement
    def broadcast(self, call: Call, *, blocking: bool = False) -> Work:
        buf, src = call.out, call.root
        self._array(buf, "tensor")

        def body(stream):
            if buf.nbytes:
                self._comm.broadcast(buf.data.ptr, buf.data.ptr, buf.nbytes, _plan.BYTES, src, stream)

        return self._launch("broadcast", body, blocking=blocking)

    def all_gather_into(self, call: Call, *, blocking: bool = False) -> Work:
        """Equal contributions: one ncclAllGather into the caller's buffer; else the list form."""
        out, inp = call.out, call.inp
        if call.out_splits is not None and len(set(call.out_splits)) > 1:
            return self.all_gather(call._replace(op=Op.ALL_GATHER, out=None, out_splits=None,
                                                 outputs=split_views(out, call.out_splits, self.size)),
                                   blocking=blocking)
        self._array(inp, "tensor")
        self._array(out, "output")
        n = inp.nbytes

        def body(stream):
            if n:
                self._comm.allGather(inp.data.ptr, out.data.ptr, n, _plan.BYTES, stream)

        return self._launch("all_gather", body, blocking=blocking)

    def all_gather(self, call: Call, *, blocking: bool = False) -> Work:
        outputs, inp = call.outputs, call.inp
        self._array(inp, "tensor")
        for i, a in enumerate(outputs):
            self._array(a, f"tensor_list[{i}]")
        n = inp.nbytes
        if all(a.nbytes == n for a in outputs):
            def body(stream):
                if not n:
                    return None
                target = self._cp.empty(n * self.size, dtype=self._cp.uint8)
                self._comm.allGather(inp.data.ptr, target.data.ptr, n, _plan.BYTES, stream)
                base = target.data.ptr
                for i, a in enumerate(outputs):
                    self._cp.cuda.runtime.memcpyAsync(a.data.ptr, base + i * n, n, _D2D, stream)
                return target

            return self._launch("all_gather", body, blocking=blocking)

        def body_uneven(stream):
            peers = [p for p in range(self.size) if p != self.rank]
            self._grouped_p2p([(inp, p) for p in peers], [(outputs[p], p) for p in peers], stream)
            self._copy(outputs[self.rank], inp, stream)

        return self._launch("all_gather", body_uneven, blocking=blocking)

    def gather(self, call: Call, *, blocking: bool = False) -> Work:
        outputs, inp, dst = call.outputs, call.inp, call.root
        self._array(inp, "tensor")
        if self.rank == dst:
            for i, a in enumerate(outputs):
                self._array(a, f"gather_list[{i}]")

            def body(stream):
                peers = [p for p in range(self.size) if p != dst]
                self._grouped_p2p([], [(outputs[p], p) for p in peers], stream)
                self._copy(outputs[dst], inp, stream)
        else:
            def body(stream):
                self._grouped_p2p([(inp, dst)], [], stream)

        return self._launch("gather", body, blocking=blocking)

    def scatter(self, call: Call, *, blocking: bool = False) -> Work:
        out, inputs, src = call.out, call.inputs, call.root
        self._array(out, "tensor")
        if self.rank == src:
            for i, a in enumerate(inputs):
                self._array(a, f"scatter_list[{i}]")

            def body(stream):
                peers = [p for p in range(self.size) if p != src]
                self._grouped_p2p([(inputs[p], p) for p in peers], [], stream)
                self._copy(out, inputs[src], stream)
        else:
            def body(stream):
                self._grouped_p2p([], [(out, src)], stream)

        return self._launch("scatter", body, blocking=blocking)

    def all_to_all(self, call: Call, *, blocking: bool = False) -> Work:
        outputs, inputs = call.outputs, call.inputs
        for i, a in enumerate(outputs):
            self._array(a, f"output_tensor_list[{i}]")
        for i, a in enumerate(inputs):
            self._array(a, f"input_tensor_list[{i}]")

        def body(stream):
            peers = [p for p in range(self.size) if p != self.rank]
            self._grouped_p2p([(inputs[p], p) for p in peers], [(outputs[p], p) for p in peers], stream)
            self._copy(outputs[self.rank], inputs[self.rank], stream)

        return self._launch("all_to_all", body, blocking=blocking)

    def barrier(self, call: Call, *, blocking: bool = False) -> Work:
        """A one-element all_reduce, then the host waits for it (bounded by the group timeout)."""
        import time

        self._check_usable("barrier")
        if self._coalesced is not None:
            raise RuntimeError("nccl barrier: not allowed inside a coalescing block")
        with self._device:
            if _capturing(self._cp.cuda.get_current_stream()):
                raise capture_error("nccl barrier", None, "the op", op_refusal("barrier", staged=False))
            token = self._cp.zeros(1, dtype=self._cp.int32)
        work = self.all_reduce(Call(Op.ALL_REDUCE, "cuda", token.dtype, out=token, redop=ReduceOp.SUM))
        if not isinstance(work, CudaWork):
            return work
        work.op = "barrier"
        deadline = time.monotonic() + self._timeout_s
        while not work.is_completed() and time.monotonic() < deadline:
            time.sleep(0.0002)
        try:
            work.wait(max(0.0, deadline - time.monotonic()) + 1.0)  # the watchdog aborts at the deadline
        except BaseException as err:  # noqa: BLE001 - delivered through the Work
            return Work.failed("barrier", err, work.seq)
        return Work.completed("barrier", work.seq)

    # ---------------------------------------------------------- point to point
    def send(self, call: Call, *, blocking: bool = False) -> Work:
        buf, dst, tag = call.out, call.root, call.tag
        self._array(buf, "tensor")
        if dst == self.rank:
            def body_self(stream):
                copy = buf.copy()  # on the current stream; a later recv from self takes it
                self._self_queue.setdefault(tag, []).append(copy)
                return copy

            return self._launch("send", body_self, blocking=blocking)

        def body(stream):
            if buf.nbytes:
                self._comm.send(buf.data.ptr, buf.nbytes, _plan.BYTES, dst, stream)

        return self._launch("send", body, blocking=blocking)

    def recv(self, call: Call, *, blocking: bool = False) -> Work:
        buf, src, tag = call.out, call.root, call.tag
        self._array(buf, "tensor")
        if src is None:
            raise NotImplementedError(
                "recv: the nccl backend cannot receive from any source (NCCL point-to-point needs the peer); "
                "pass src=, or use the socket or mpi backend for wildcard receives"
            )
        if src == self.rank:
            queue = self._self_queue.get(tag)
            if not queue:
                raise DistBackendError(f"nccl recv: no send to self with tag {tag} is pending on rank "
                                       f"{self.rank}; a receive from self would never complete")
            sent = queue.pop(0)
            if sent.nbytes != buf.nbytes:
                raise ValueError(f"tensor: recv from self expected {sent.nbytes} bytes (the matching send), "
                                 f"got a buffer of {buf.nbytes} bytes")
            return self._launch("recv", lambda stream: self._copy(buf, sent, stream), outputs=[src],
                                keepalive=sent)

        def body(stream):
            if buf.nbytes:
                self._comm.recv(buf.data.ptr, buf.nbytes, _plan.BYTES, src, stream)

        return self._launch("recv", body, outputs=[src])

    # -------------------------------------------------------------- lifetime
    def close(self) -> None:
        if self._closed:
            return
        # Works of an open coalescing block have no event yet (see _work.unfinished).
        pending = self._watchdog.pending() + [w for w, _ in self._coalesced or ()]
        busy = unfinished(pending) or self._watchdog.busy()
        self._watchdog.stop()
        self._closed = True
        try:
            with self._device:
                if busy or self._fatal is not None:
                    self._comm.abort()  # destroy would wait for kernels that may never finish
                else:
                    self._comm.destroy()
        except Exception:  # noqa: BLE001 - closing must not raise
            log.debug("closing the NCCL communicator failed", exc_info=True)
        exc = DistBackendError(f"nccl: the backend of group {self.ctx.group_name!r} was closed")
        settle_at_close(pending, busy, exc)
        self._watchdog.fail_all(exc)
        self._captured_keep.clear()
        self._events.clear()

    def abort(self) -> None:
        exc = DistBackendError(f"nccl: the backend of group {self.ctx.group_name!r} was aborted")
        self._abort_comm(exc)
        self._watchdog.fail_all(exc)
        self.close()
