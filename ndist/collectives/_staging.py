"""CUDA arrays through CPU backends: stage through pinned host buffers.

``wrap_for_cuda(cpu_backend)`` returns a ``HostStagingBackend``: a Backend
that takes CuPy arrays, copies what the operation reads into page-locked host
buffers (one packed buffer per call, reused across calls), runs the wrapped
CPU backend's operation on NumPy views of them, and copies what the operation
wrote back to the device on the stream that was current at the call. The
returned Work completes once those copies finished, so after ``wait()`` the
results are visible to any stream.

Ordering: the device-to-host copies are enqueued on the caller's current
stream and the host waits for them (an event) before the CPU backend runs, so
kernels the caller enqueued before the collective are respected, as in torch's
Gloo backend with CUDA tensors.

**Pipelined** (``all_reduce``, ``reduce``, ``broadcast`` with ``blocking=True``,
i.e. ``async_op=False``): the buffer is cut into chunks (``_staging_plan.py``)
that go through ``depth`` pinned slots of the backend, allocated once and reused
across calls. The copies of chunk ``k+1`` to the host (caller's stream) and of
chunk ``k-1`` back (a side stream of the device) run while the host exchanges
chunk ``k``; the call returns once the last copy back finished. Other ops, and
``async_op=True`` calls, stage through one packed buffer per call.

**CUDA graphs**: a host-staged op cannot be recorded into a graph; on a stream
being captured it raises ``DistCaptureError`` before anything is copied or sent
(``_capture.py``).

The device side is an ``ArrayModule`` adapter: ``CupyArrays`` for CUDA, and
``HostArrays``, which treats NumPy arrays as the "device" so that the very
same staging code runs, over a real CPU backend, on machines without a GPU.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

import numpy as np

from ..runtime import Work
from . import _staging_plan
from ._backend import DONE, Call, CollectiveBackend, Op
from ._capture import capture_error, op_refusal

__all__ = ["HostStagingBackend", "wrap_for_cuda", "ArrayModule", "CupyArrays", "HostArrays", "PinnedPool"]

log = logging.getLogger("ndist.collectives.staging")

_ALIGN = 256  # bytes; every staged array starts on this boundary in the packed buffer
_MIN_CLASS = 1 << 12


def _round_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


class ArrayModule:
    """How the staging backend talks to the device. Subclasses: ``CupyArrays``, ``HostArrays``."""

    name = "abstract"

    def is_device_array(self, a: Any) -> bool:
        raise NotImplementedError

    def alloc_host(self, nbytes: int) -> np.ndarray:
        """A (pinned) host buffer of ``nbytes``, as a flat ``uint8`` NumPy array."""
        raise NotImplementedError

    def capture(self) -> Any:
        """What identifies "the current stream" at call time."""
        return None

    def to_host(self, src: Any, dst: np.ndarray, where: Any) -> None:
        raise NotImplementedError

    def to_device(self, src: np.ndarray, dst: Any, where: Any) -> None:
        raise NotImplementedError

    def fence(self, where: Any) -> None:
        """Block the host until the copies enqueued on ``where`` so far finished."""

    def to_numpy(self, a: Any) -> Any:
        """A host copy of a (small) device array, e.g. PREMUL_SUM's factor."""
        return a

    def capturing(self, where: Any) -> bool:
        """True if ``where``'s stream is being captured into a CUDA graph."""
        return False

    def flat_bytes(self, a: Any) -> Any:
        """A flat ``uint8`` view of the (contiguous) device array ``a``."""
        return a.reshape(-1).view(np.uint8)

    def side(self, where: Any) -> Any:
        """A second stream of ``where``'s device, for copies that overlap those on ``where``."""
        return where

    def record(self, where: Any) -> Any:
        """A marker of the work enqueued on ``where`` so far (an event)."""
        return None

    def host_wait(self, marker: Any) -> None:
        """Block the host until ``marker``'s work finished."""

    def stream_wait(self, where: Any, marker: Any) -> None:
        """Make later work on ``where`` wait for ``marker``'s (the host does not block)."""


class HostArrays(ArrayModule):
    """NumPy arrays in the role of device arrays; copies are plain memcpys."""

    name = "numpy"

    def is_device_array(self, a: Any) -> bool:
        return isinstance(a, np.ndarray)

    def alloc_host(self, nbytes: int) -> np.ndarray:
        return np.empty(nbytes, dtype=np.uint8)

    def to_host(self, src, dst, where) -> None:
        dst[...] = src.reshape(-1).view(np.uint8)

    def to_device(self, src, dst, where) -> None:
        dst.reshape(-1).view(np.uint8)[...] = src


class CupyArrays(ArrayModule):
    """CuPy arrays; pinned buffers from ``cupy.cuda.alloc_pinned_memory``, async copies on the stream."""

    name = "cupy"

    def __init__(self) -> None:
        import cupy

        self._cp = cupy
        self._sides: dict[int, Any] = {}  # device id -> the side stream (made once)

    def is_device_array(self, a: Any) -> bool:
        return isinstance(a, self._cp.ndarray)

    def capturing(self, where) -> bool:
        stream = where[1]
        return bool(stream.ptr) and bool(stream.is_capturing())  # (the legacy stream, ptr 0, cannot capture)

    def side(self, where) -> Any:
        device, _ = where
        stream = self._sides.get(device.id)
        if stream is None:
            with device:
                stream = self._sides.setdefault(device.id, self._cp.cuda.Stream(non_blocking=True))
        return device, stream

    def record(self, where) -> Any:
        device, stream = where
        with device:
            event = self._cp.cuda.Event(block=False, disable_timing=True)
            event.record(stream)
        return event

    def host_wait(self, marker) -> None:
        marker.synchronize()

    def stream_wait(self, where, marker) -> None:
        device, stream = where
        with device:
            stream.wait_event(marker)

    def alloc_host(self, nbytes: int) -> np.ndarray:
        mem = self._cp.cuda.alloc_pinned_memory(nbytes)
        return np.ndarray((nbytes,), dtype=np.uint8, buffer=mem)  # keeps ``mem`` alive as its base

    def capture(self) -> Any:
        cp = self._cp
        return cp.cuda.Device(), cp.cuda.get_current_stream()

    def _copy(self, dst_ptr: int, src_ptr: int, nbytes: int, kind: int, where) -> None:
        device, stream = where
        with device:
            self._cp.cuda.runtime.memcpyAsync(dst_ptr, src_ptr, nbytes, kind, stream.ptr)

    def to_host(self, src, dst, where) -> None:
        if src.nbytes:
            self._copy(dst.ctypes.data, src.data.ptr, src.nbytes, 2, where)  # cudaMemcpyDeviceToHost

    def to_device(self, src, dst, where) -> None:
        if dst.nbytes:
            self._copy(dst.data.ptr, src.ctypes.data, dst.nbytes, 1, where)  # cudaMemcpyHostToDevice

    def fence(self, where) -> None:
        device, stream = where
        with device:
            event = self._cp.cuda.Event(block=False, disable_timing=True)
            event.record(stream)
            event.synchronize()

    def to_numpy(self, a):
        return self._cp.asnumpy(a)


class PinnedPool:
    """Host buffers by power-of-two size class, reused across calls; thread-safe.

    At most ``keep`` free buffers are cached per class; a buffer in use is
    never handed out twice.
    """

    def __init__(self, alloc: Callable[[int], np.ndarray], keep: int = 4) -> None:
        self._alloc = alloc
        self._keep = keep
        self._free: dict[int, list[np.ndarray]] = {}
        self._lock = threading.Lock()
        self.allocations = 0  # how many buffers were ever allocated (reuse is visible in tests)

    def acquire(self, nbytes: int) -> np.ndarray:
        size = max(_MIN_CLASS, 1 << max(0, nbytes - 1).bit_length())
        with self._lock:
            free = self._free.get(size)
            if free:
                return free.pop()
            self.allocations += 1
        return self._alloc(size)

    def release(self, buf: np.ndarray) -> None:
        with self._lock:
            free = self._free.setdefault(buf.nbytes, [])
            if len(free) < self._keep:
                free.append(buf)

    def clear(self) -> None:
        with self._lock:
            self._free.clear()


class _Staging:
    """The host twins of one call's device arrays, packed in one pooled buffer."""

    def __init__(self, arrays: ArrayModule, pool: PinnedPool, reads: list, writes: list, where: Any = None) -> None:
        self.arrays = arrays
        self.pool = pool
        self.where = arrays.capture() if where is None else where
        self.twins: dict[int, np.ndarray] = {}
        self.reads = [a for a in reads if a is not None]
        self.writes = [a for a in writes if a is not None]
        distinct: dict[int, Any] = {}
        for a in self.reads + self.writes:
            distinct.setdefault(id(a), a)
        total = sum(_round_up(a.nbytes, _ALIGN) for a in distinct.values())
        self.buffer = pool.acquire(total) if distinct else None
        offset = 0
        for key, a in distinct.items():
            dtype = np.dtype(a.dtype)
            if a.nbytes:
                self.twins[key] = self.buffer[offset:offset + a.nbytes].view(dtype).reshape(a.shape)
            else:
                self.twins[key] = np.empty(a.shape, dtype=dtype)
            offset += _round_up(a.nbytes, _ALIGN)

    def twin(self, a: Any) -> Any:
        return None if a is None else self.twins[id(a)]

    def copy_in(self) -> None:
        for a in self.reads:
            self.arrays.to_host(a, self.buffer_view(a), self.where)
        if self.reads:
            self.arrays.fence(self.where)

    def buffer_view(self, a: Any) -> np.ndarray:
        return self.twins[id(a)].reshape(-1).view(np.uint8)

    def copy_out(self) -> None:
        try:
            for a in self.writes:
                self.arrays.to_device(self.buffer_view(a), a, self.where)
        finally:
            if self.writes:
                self.arrays.fence(self.where)

    def release(self) -> None:
        if self.buffer is not None:
            self.pool.release(self.buffer)
            self.buffer = None


def _roles(call: Call, rank: int) -> tuple[list, list]:
    """``(reads, writes)``: the device arrays ``call`` reads and writes on ``rank``."""
    op, root = call.op, call.root
    if op in (Op.ALL_REDUCE,):
        return [call.out], [call.out]
    if op is Op.REDUCE:
        return [call.out], [call.out] if rank == root else []
    if op is Op.BROADCAST:
        return ([call.out], []) if rank == root else ([], [call.out])
    if op is Op.SEND:
        return [call.out], []
    if op is Op.RECV:
        return [], [call.out]
    if op is Op.BARRIER:
        return [], []
    reads = [call.inp] if call.inp is not None else list(call.inputs or ())
    writes = [call.out] if call.out is not None else list(call.outputs or ())
    return reads, writes


class HostStagingBackend(CollectiveBackend):
    """Runs a CPU backend's operations on device arrays through host buffers.

    Each call's device arrays get host twins in one pooled pinned buffer; the
    same record, with the twins in place of the device arrays, goes to the
    wrapped backend's method of the same op.
    """

    def __init__(self, inner: CollectiveBackend, arrays: ArrayModule | None = None,
                 pool: PinnedPool | None = None, chunk_bytes: int | None = None,
                 depth: int = _staging_plan.DEPTH) -> None:
        if isinstance(inner, HostStagingBackend):  # (its twins would be staged again: host arrays
            # taken for device ones, failing at the first op with an obscure AttributeError)
            raise TypeError(f"inner: expected a CPU backend, got a HostStagingBackend over {inner.inner.name!r} "
                            f"(it stages device arrays already)")
        super().__init__(inner.ctx)
        self.inner = inner
        self.arrays = arrays if arrays is not None else CupyArrays()
        self.pool = pool if pool is not None else PinnedPool(self.arrays.alloc_host)
        self.name = inner.name
        _staging_plan.chunk_plan(0, 1, chunk_bytes, depth)  # checks both (ValueError naming the argument)
        # (None: each buffer's own, _staging_plan.auto_chunk_bytes)
        self.chunk_bytes = chunk_bytes
        self.depth = depth
        self._slots: list[np.ndarray] = []  # the pipeline's pinned slots, made on first use
        self._slot_bytes = 0
        self._pipe_lock = threading.Lock()

    # -------------------------------------------------------------- machinery
    def _staged(self, method, call: Call, blocking: bool) -> Work:
        reads, writes = _roles(call, self.rank)
        if not reads and not writes:
            return method(call, blocking=blocking)
        where = self.arrays.capture()
        if self.arrays.capturing(where):
            raise capture_error(f"{self.name} {call.op}", None, "a host-staged op", op_refusal(str(call.op), staged=True))
        if blocking and call.op in _staging_plan.CHUNKED_OPS and call.out is not None and call.out.nbytes:
            return self._pipelined(method, call, where, bool(reads), bool(writes))
        staging = _Staging(self.arrays, self.pool, reads, writes, where)
        twin = staging.twin
        host = call._replace(
            out=twin(call.out), inp=twin(call.inp),
            outputs=None if call.outputs is None else [twin(a) for a in call.outputs],
            inputs=None if call.inputs is None else [twin(a) for a in call.inputs],
            scale=self._scale(call.scale))
        try:
            staging.copy_in()
            inner = method(host, blocking=blocking)
        except BaseException:
            staging.release()
            raise
        if inner is DONE:  # the wrapped backend finished inline
            try:
                staging.copy_out()
            finally:
                staging.release()
            return DONE
        done = Work(str(call.op), inner.seq, None, inner.pending)

        def finish(w: Work) -> None:
            # A done hook: runs on whichever thread completed the inner work (at once if it already had).
            exc = w.error
            if exc is None:
                try:
                    staging.copy_out()
                except BaseException as err:  # noqa: BLE001 - delivered to the waiter
                    exc = err
            staging.release()  # before completing: a waiter may reuse the buffer at once
            if exc is None:
                done.outputs = w.outputs  # e.g. recv's [source], known only at completion
                done.complete()
            else:
                done.fail(exc)

        inner.add_done_hook(finish)
        return done

    def _slots_for(self, step: int) -> list[np.ndarray]:
        """The pipeline's ``depth`` pinned slots of at least ``step`` bytes (reused across calls)."""
        if self._slot_bytes < step:
            self._slots = [self.arrays.alloc_host(step) for _ in range(self.depth)]
            self._slot_bytes = step
        return self._slots

    def _pipelined(self, method, call: Call, where: Any, read: bool, write: bool) -> Work:
        """Stage ``call.out`` chunk by chunk (``_staging_plan``), overlapping each chunk's copy
        to the host, its exchange (``method``, blocking) and its copy back; return DONE.

        The copies to the host go on the caller's stream ``where`` (after the kernels
        the caller enqueued), those back on a side stream; a slot is written again only
        after the copy out of it finished. The call returns once every copy back
        finished, so the results are visible to any stream.
        """
        arrays, buf = self.arrays, call.out
        dtype = np.dtype(buf.dtype)
        plan = _staging_plan.chunk_plan(buf.nbytes, dtype.itemsize, self.chunk_bytes, self.depth)
        host_call = call._replace(scale=self._scale(call.scale))
        timeout = self.ctx.timeout
        with self._pipe_lock:
            slots = self._slots_for(plan[0].nbytes)
            flat = arrays.flat_bytes(buf)
            back = arrays.side(where)
            copied_in: list = [None] * len(plan)
            copied_out: list = [None] * len(plan)
            if write:  # copies back wait for the kernels the caller enqueued before the call
                arrays.stream_wait(back, arrays.record(where))

            def copy_in(c) -> None:
                arrays.to_host(flat[c.offset:c.offset + c.nbytes], slots[c.slot][:c.nbytes], where)
                copied_in[c.index] = arrays.record(where)

            if read:
                for c in plan[:self.depth]:
                    copy_in(c)
            try:
                for c in plan:
                    if read:
                        arrays.host_wait(copied_in[c.index])
                    elif write and c.index >= self.depth:  # the slot's previous chunk was copied out
                        arrays.host_wait(copied_out[c.index - self.depth])
                    host = slots[c.slot][:c.nbytes].view(dtype)
                    work = method(host_call._replace(out=host), blocking=True)
                    if work is not DONE:
                        work.wait(timeout)
                    if write:
                        arrays.to_device(slots[c.slot][:c.nbytes], flat[c.offset:c.offset + c.nbytes], back)
                        copied_out[c.index] = arrays.record(back)
                    later = c.index + self.depth
                    if read and later < len(plan):
                        if write:  # the copy into the slot waits for the copy out of it (on the GPU)
                            arrays.stream_wait(where, copied_out[c.index])
                        copy_in(plan[later])
            finally:
                # (also after a failure: no copy may still read or write a slot when it is reused)
                last = [m for m in (copied_out if write else copied_in) if m is not None]
                if last:
                    arrays.host_wait(last[-1])
                if read and write:
                    pending_in = [m for m in copied_in if m is not None]
                    if pending_in:
                        arrays.host_wait(pending_in[-1])
        return DONE

    def _scale(self, scale: Any) -> Any:
        data = getattr(scale, "_data", scale)
        if scale is not None and self.arrays.is_device_array(data) and not isinstance(data, np.ndarray):
            return self.arrays.to_numpy(data)
        return scale

    # ---------------------------------------------------------- every op: staged
    def all_reduce(self, call: Call, *, blocking: bool = False) -> Work:
        return self._staged(self.inner.all_reduce, call, blocking)

    def reduce(self, call: Call, *, blocking: bool = False) -> Work:
        return self._staged(self.inner.reduce, call, blocking)

    def reduce_scatter(self, call: Call, *, blocking: bool = False) -> Work:
        return self._staged(self.inner.reduce_scatter, call, blocking)

    def reduce_scatter_from(self, call: Call, *, blocking: bool = False) -> Work:
        return self._staged(self.inner.reduce_scatter_from, call, blocking)

    def broadcast(self, call: Call, *, blocking: bool = False) -> Work:
        return self._staged(self.inner.broadcast, call, blocking)

    def all_gather(self, call: Call, *, blocking: bool = False) -> Work:
        return self._staged(self.inner.all_gather, call, blocking)

    def all_gather_into(self, call: Call, *, blocking: bool = False) -> Work:
        return self._staged(self.inner.all_gather_into, call, blocking)

    def gather(self, call: Call, *, blocking: bool = False) -> Work:
        return self._staged(self.inner.gather, call, blocking)

    def scatter(self, call: Call, *, blocking: bool = False) -> Work:
        return self._staged(self.inner.scatter, call, blocking)

    def all_to_all(self, call: Call, *, blocking: bool = False) -> Work:
        return self._staged(self.inner.all_to_all, call, blocking)

    def all_to_all_single(self, call: Call, *, blocking: bool = False) -> Work:
        return self._staged(self.inner.all_to_all_single, call, blocking)

    def barrier(self, call: Call, *, blocking: bool = False) -> Work:
        return self.inner.barrier(call, blocking=blocking)

    def send(self, call: Call, *, blocking: bool = False) -> Work:
        return self._staged(self.inner.send, call, blocking)

    def recv(self, call: Call, *, blocking: bool = False) -> Work:
        return self._staged(self.inner.recv, call, blocking)

    # ------------------------------------- the group's loss hooks: passed on
    # (optional on a backend, ``ProcessGroup`` looks them up with getattr: each is passed
    # on only where the wrapped backend has it; without them a revoked group's waits in the
    # wrapped backend, its link set-up's say, would last the whole group timeout)
    def member_lost(self, rank: int, host: Any, message: str) -> None:
        self._pass_on("member_lost", rank, host, message)

    def member_departed(self, rank: int, host: Any, message: str) -> None:
        self._pass_on("member_departed", rank, host, message)

    def group_revoked(self, rank: int, host: Any, message: str) -> None:
        self._pass_on("group_revoked", rank, host, message)

    def members_kept(self, ranks: Any) -> None:
        self._pass_on("members_kept", ranks)

    def _pass_on(self, hook: str, *args: Any) -> None:
        method = getattr(self.inner, hook, None)
        if method is not None:
            method(*args)

    # -------------------------------------------------------------- lifetime
    def close(self) -> None:
        self.inner.close()
        self.pool.clear()
        self._slots, self._slot_bytes = [], 0

    def abort(self) -> None:
        self.inner.abort()
        self.pool.clear()
        self._slots, self._slot_bytes = [], 0

    def __repr__(self) -> str:
        return f"<HostStagingBackend over {self.inner!r} ({self.arrays.name})>"


def wrap_for_cuda(backend: CollectiveBackend) -> HostStagingBackend:
    """``backend`` (a CPU backend) serving CuPy arrays through pinned host buffers; a
    backend that stages them already is returned as it is."""
    if isinstance(backend, HostStagingBackend):
        return backend
    return HostStagingBackend(backend, CupyArrays())
