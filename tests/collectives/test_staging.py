"""HostStagingBackend over the real socket backend, with NumPy arrays in the device role.

``HostArrays`` makes NumPy arrays play the device arrays, so the staging code
(packed pooled buffers, copies in, the wrapped CPU op, copies out, Work
chaining, buffer release) runs exactly as for CuPy, over real sockets / shared
memory. Ranks are threads of this process (each with its own backend and real
connections), as in the socket backend's own tests; the CuPy path is in
tests/gpu/test_staging_cupy.py.
"""

from __future__ import annotations

import itertools
from datetime import timedelta

import numpy as np
import pytest

pytest.importorskip("ndist.collectives.backends.socket")

from ndist.collectives import ReduceOp  # noqa: E402
from ndist.collectives._backend import DONE  # noqa: E402
from ndist.runtime import DistMismatchError  # noqa: E402
from ndist.collectives._staging import HostArrays, HostStagingBackend  # noqa: E402

from tests.backend_driver import Driver  # noqa: E402
from tests.backend_threads import run_backends  # noqa: E402
from ndist.runtime import BackendContext, HashStore, get_backend_spec  # noqa: E402

pytestmark = pytest.mark.timeout(120)
_ids = itertools.count()


def _run_threads(n, name, make, fn, timeout):
    """``fn(backend)`` on ``n`` ranks (threads), each with the staging backend ``make(ctx)``
    builds over the real socket backend; returns the results by rank."""
    return run_backends(n, make, fn, timeout=timeout, join=2, name=name)


def run_staged(n, fn, timeout=30.0):
    """``fn(staging_backend)`` on ``n`` ranks (threads); returns the results by rank."""
    return _run_threads(n, f"staging{next(_ids)}",
                        lambda ctx: Driver(HostStagingBackend(get_backend_spec("socket").create(ctx), HostArrays())),
                        fn, timeout)


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["float32", "int16", "complex64"])
def test_all_reduce_sum_and_premul(n, dtype):
    def fn(be):
        x = (np.arange(10) + be.rank).astype(dtype)
        be.all_reduce(x, ReduceOp.SUM).wait(30)
        y = np.full(4, be.rank + 1, dtype=dtype)
        be.all_reduce(y, ReduceOp.PREMUL_SUM, scale=np.asarray(2)).wait(30)
        return x, y

    for x, y in run_staged(n, fn):
        np.testing.assert_array_equal(x, (np.arange(10) * n + n * (n - 1) // 2).astype(dtype))
        np.testing.assert_array_equal(y, np.full(4, n * (n + 1), dtype=dtype))


def test_reduce_writes_only_on_dst_and_bool_max():
    def fn(be):
        x = np.array([be.rank, 10 - be.rank], dtype=np.int64)
        be.reduce(x, 1, ReduceOp.MAX).wait(30)
        flags = np.array([be.rank == 0, False])
        be.all_reduce(flags, ReduceOp.MAX).wait(30)
        return x, flags

    (x0, f0), (x1, f1), (x2, _) = run_staged(3, fn)
    np.testing.assert_array_equal(x1, [2, 10])
    np.testing.assert_array_equal(x0, [0, 10])  # non-root buffers unchanged
    np.testing.assert_array_equal(x2, [2, 8])
    np.testing.assert_array_equal(f1, [True, False])


def test_reduce_scatter_uneven():
    sizes = [1, 0, 3]

    def fn(be):
        inputs = [np.full(s, be.rank + 1, dtype=np.float64) for s in sizes]
        out = np.zeros(sizes[be.rank])
        be.reduce_scatter(out, inputs, ReduceOp.SUM).wait(30)
        return out

    for r, out in enumerate(run_staged(3, fn)):
        np.testing.assert_array_equal(out, np.full(sizes[r], 6.0))


def test_broadcast_all_gather_gather_scatter_uneven():
    def fn(be):
        n, r = be.size, be.rank
        b = np.arange(5, dtype=np.uint16) if r == 1 else np.zeros(5, np.uint16)
        be.broadcast(b, 1).wait(30)
        mine = np.full(r + 1, r, dtype=np.int32)
        gathered = [np.zeros(i + 1, np.int32) for i in range(n)]
        be.all_gather(gathered, mine).wait(30)
        at_root = [np.zeros(i + 1, np.int32) for i in range(n)] if r == 0 else None
        be.gather(at_root, mine, 0).wait(30)
        out = np.zeros(r + 2, np.float32)
        pieces = [np.full(i + 2, 10 * i, np.float32) for i in range(n)] if r == 2 else None
        be.scatter(out, pieces, 2).wait(30)
        return b, gathered, at_root, out

    for r, (b, gathered, at_root, out) in enumerate(run_staged(3, fn)):
        np.testing.assert_array_equal(b, np.arange(5))
        for i, g in enumerate(gathered):
            np.testing.assert_array_equal(g, np.full(i + 1, i))
        if r == 0:
            for i, g in enumerate(at_root):
                np.testing.assert_array_equal(g, np.full(i + 1, i))
        np.testing.assert_array_equal(out, np.full(r + 2, 10 * r))


def test_all_to_all_uneven_with_empty_pieces():
    def fn(be):
        n, r = be.size, be.rank
        # rank r sends (r + j) % 3 elements to rank j
        inputs = [np.full((r + j) % 3, 100 * r + j, dtype=np.int64) for j in range(n)]
        outputs = [np.zeros((i + r) % 3, dtype=np.int64) for i in range(n)]
        be.all_to_all(outputs, inputs).wait(30)
        return outputs

    for r, outputs in enumerate(run_staged(3, fn)):
        for i, o in enumerate(outputs):
            np.testing.assert_array_equal(o, np.full((i + r) % 3, 100 * i + r))


def test_send_recv_async_with_tags_and_source():
    def fn(be):
        if be.rank == 0:
            a, b = np.arange(3.0), np.arange(3.0) + 7
            w1, w2 = be.send(a, 1, tag=5), be.send(b, 1, tag=6)
            a[...] = -1  # the data was staged at the call
            w1.wait(30)
            w2.wait(30)
            return None
        got6, got5 = np.zeros(3), np.zeros(3)
        w6 = be.recv(got6, 0, tag=6)
        w5 = be.recv(got5, 0, tag=5)
        assert w6.result() == [0] and w5.result() == [0]
        return got5, got6

    _, (got5, got6) = run_staged(2, fn)
    np.testing.assert_array_equal(got5, np.arange(3.0))
    np.testing.assert_array_equal(got6, np.arange(3.0) + 7)


def test_host_buffers_are_reused_across_calls():
    def fn(be):
        for i in range(20):
            x = np.full(1000, i, np.float32)
            be.all_reduce(x, ReduceOp.SUM).wait(30)
        be.barrier().wait(30)
        return be.pool.allocations

    assert run_staged(2, fn) == [1, 1]


def test_failed_inner_op_releases_its_buffer():
    def fn(be):
        # rank 0 all_reduce against rank 1 all_gather: the inner backend fails both
        with pytest.raises(DistMismatchError):
            if be.rank == 0:
                be.all_reduce(np.zeros(4), ReduceOp.SUM).wait(30)
            else:
                be.all_gather([np.zeros(4), np.zeros(4)], np.zeros(4)).wait(30)
        first = be.pool.allocations
        be.all_reduce(np.ones(4), ReduceOp.SUM).wait(30)  # the next matched op works, same buffer
        return first, be.pool.allocations

    assert run_staged(2, fn) == [(1, 1), (1, 1)]


def test_blocking_is_forwarded():
    """blocking=True reaches the wrapped backend: the socket backend then runs the op
    inline and returns the shared DONE, which the wrapper passes on after copying out."""
    def fn(be):
        x = np.ones(3)
        w = be.all_reduce(x, ReduceOp.SUM, blocking=True)
        return w is DONE, x

    for done, x in run_staged(2, fn):
        assert done
        np.testing.assert_array_equal(x, [2, 2, 2])


def _staged_ops_in_a_rank(rank, world_size):
    from ndist.runtime import resolve_group

    be = Driver(HostStagingBackend(resolve_group(None).backend_for("cpu"), HostArrays()))
    x = np.arange(5.0) + rank
    be.all_reduce(x, ReduceOp.SUM).wait(30)
    outs = [np.zeros(i + 1, np.int16) for i in range(world_size)]
    be.all_gather(outs, np.full(rank + 1, rank, np.int16)).wait(30)
    return x, outs


@pytest.mark.timeout(180)
def test_staging_over_socket_in_separate_processes():
    from ndist.testing import run_ranks

    n = 3
    for x, outs in run_ranks(_staged_ops_in_a_rank, n, backend="socket", timeout=120):
        np.testing.assert_array_equal(x, np.arange(5.0) * n + n * (n - 1) / 2)
        for i, o in enumerate(outs):
            np.testing.assert_array_equal(o, np.full(i + 1, i))


def test_peer_failure_reaches_the_staged_work_and_frees_its_buffer():
    from ndist.runtime import DistError

    def fn(be):
        if be.rank == 1:
            be.inner.close()  # this rank leaves without joining the collective
            return None
        x = np.arange(4.0)
        work = be.all_reduce(x, ReduceOp.SUM)
        with pytest.raises(DistError):
            work.wait(60)
        np.testing.assert_array_equal(x, np.arange(4.0))  # nothing was written back
        buf = be.pool.acquire(32)
        return be.pool.allocations, buf.nbytes

    assert run_staged(2, fn, timeout=3.0)[0] == (1, 4096)


def test_socket_backend_serves_cuda_tensors_through_staging():
    # CuPy tensors on backend="socket" (e.g. several ranks sharing one GPU) go through
    # the socket backend's factory, which wraps it with host staging for ctx.device == "cuda".
    from datetime import timedelta

    from ndist.runtime import BackendContext, HashStore
    import ndist.collectives  # noqa: F401  (registers the built-in backends)
    from ndist.collectives.backends import socket as socket_backend
    from ndist.runtime import get_backend_spec
    from ndist.runtime._group import parse_backend

    assert get_backend_spec("socket").devices == ("cpu", "cuda")
    assert parse_backend("socket") == {"cpu": "socket", "cuda": "socket"}
    assert parse_backend("cpu:socket,cuda:socket") == {"cpu": "socket", "cuda": "socket"}
    try:
        import cupy  # noqa: F401
    except ImportError:
        # the cuda instance is the staging wrapper, which needs CuPy: here it says so
        ctx = BackendContext(HashStore(timeout=5), 0, 1, timedelta(seconds=5), "staging-probe", (0,), "cuda")
        with pytest.raises(ImportError, match="cupy"):
            socket_backend.create(ctx)


def test_staging_a_staging_backend_again_is_refused_or_returns_it():
    """A staging backend's twins are host arrays: staged again, they would be taken for device
    arrays and fail at the first op. The constructor says so; ``wrap_for_cuda`` of a backend
    that stages already returns it as it is."""
    from ndist.collectives._staging import wrap_for_cuda

    def fn(be):
        staged = be.backend
        with pytest.raises(TypeError, match=r"inner: expected a CPU backend, got a HostStagingBackend over 'socket'"):
            HostStagingBackend(staged, HostArrays())
        assert wrap_for_cuda(staged) is staged
        x = np.full(4, be.rank + 1.0)
        be.all_reduce(x, ReduceOp.SUM).wait(30)  # the group is usable afterwards
        return x.tolist()

    assert run_staged(2, fn) == [[3.0] * 4] * 2


# ------------------------------------------------------------------ pipelined staging
# Blocking all_reduce / reduce / broadcast go chunk by chunk through the backend's pinned
# slots (``_staging_plan``); here with 256-byte chunks so that a small buffer has many.

def run_pipelined(n, fn, chunk_bytes=256, depth=2, timeout=30.0):
    """``fn(driver, staging_backend)`` on ``n`` ranks, the staging backend pipelining in
    ``chunk_bytes`` chunks through ``depth`` slots."""
    def make(ctx):
        return HostStagingBackend(get_backend_spec("socket").create(ctx), HostArrays(),
                                  chunk_bytes=chunk_bytes, depth=depth)

    return _run_threads(n, f"staging-pipe{next(_ids)}", make, lambda staging: fn(Driver(staging), staging), timeout)


@pytest.mark.parametrize("n", [2, 3])
def test_pipelined_all_reduce_reduce_and_broadcast_in_chunks_through_reused_slots(n):
    def fn(be, staging):
        count = 1000  # 4,000 bytes of float32: 16 chunks of 256 bytes through 2 slots
        x = (np.arange(count) + be.rank).astype(np.float32)
        assert be.all_reduce(x, ReduceOp.SUM, blocking=True) is DONE
        slots = [id(s) for s in staging._slots]
        y = np.full(count, be.rank + 1, dtype=np.float64)
        assert be.all_reduce(y, ReduceOp.PREMUL_SUM, scale=np.asarray(0.5), blocking=True) is DONE
        z = np.full(count + 3, be.rank + 1, dtype=np.int64)  # not a whole number of chunks
        be.reduce(z, 1, ReduceOp.MAX, blocking=True)
        b = (np.arange(777, dtype=np.int16) * (1 if be.rank == 0 else 0))
        be.broadcast(b, 0, blocking=True)
        c = np.full(5, be.rank + 1, dtype=np.complex64)
        be.all_reduce(c, ReduceOp.AVG, blocking=True)
        assert [id(s) for s in staging._slots] == slots and len(slots) == 2  # reused across calls
        assert staging.pool.allocations == 0  # no packed buffer: every call was pipelined
        return x, y, z, b, c

    for rank, (x, y, z, b, c) in enumerate(run_pipelined(n, fn)):
        np.testing.assert_array_equal(x, (np.arange(1000) * n + n * (n - 1) // 2).astype(np.float32))
        np.testing.assert_allclose(y, np.full(1000, n * (n + 1) / 4))
        if rank == 1:
            np.testing.assert_array_equal(z, np.full(1003, n))
        else:
            np.testing.assert_array_equal(z, np.full(1003, rank + 1))  # off the root: unchanged
        np.testing.assert_array_equal(b, np.arange(777, dtype=np.int16))
        np.testing.assert_allclose(c, np.full(5, (n + 1) / 2, dtype=np.complex64))


def test_async_and_other_ops_keep_the_packed_buffer():
    def fn(be, staging):
        x = np.ones(1000, dtype=np.float32)
        be.all_reduce(x, ReduceOp.SUM).wait(30)  # async: one packed buffer
        out = np.zeros(2000, dtype=np.float32)
        be.all_gather_into(out, x, blocking=True)  # not chunked
        return staging.pool.allocations, staging._slots, x, out

    for allocations, slots, x, out in run_pipelined(2, fn):
        assert allocations >= 1 and slots == []
        np.testing.assert_array_equal(x, np.full(1000, 2.0))
        np.testing.assert_array_equal(out, np.full(2000, 2.0))


@pytest.mark.parametrize("kwargs, message", [
    (dict(chunk_bytes=0), r"chunk_bytes: expected an int >= the element size"),
    (dict(depth=0), r"depth: expected an int >= 1, got 0"),
])
def test_bad_pipeline_settings_are_refused(kwargs, message):
    ctx = BackendContext(store=HashStore(), rank=0, size=1, timeout=timedelta(seconds=10), group_name="bad-pipe",
                         global_ranks=(0,), device="cpu")
    inner = get_backend_spec("socket").create(ctx)
    try:
        with pytest.raises(ValueError, match=message):
            HostStagingBackend(inner, HostArrays(), **kwargs)
    finally:
        inner.close()


class OrderedArrays(HostArrays):
    """``HostArrays`` that keep a log of the pipeline's steps, with two named streams.

    The copies are NumPy's (done at once); the log shows the order the pipeline asks for
    them and for the events that would order them on a GPU.
    """

    def __init__(self) -> None:
        self.log: list = []
        self._marks = itertools.count()

    def capture(self):
        return "caller"

    def side(self, where):
        return "side"

    def to_host(self, src, dst, where):
        self.log.append(("d2h", src.ctypes.data, dst.ctypes.data, where))
        super().to_host(src, dst, where)

    def to_device(self, src, dst, where):
        self.log.append(("h2d", dst.ctypes.data, src.ctypes.data, where))
        super().to_device(src, dst, where)

    def record(self, where):
        mark = next(self._marks)
        self.log.append(("record", mark, where))
        return mark

    def host_wait(self, marker):
        self.log.append(("host_wait", marker))

    def stream_wait(self, where, marker):
        self.log.append(("stream_wait", where, marker))


def test_the_pipeline_orders_each_slot_reuse_after_the_copy_out_of_it():
    arrays = OrderedArrays()
    ctx = BackendContext(store=HashStore(), rank=0, size=1, timeout=timedelta(seconds=30), group_name="pipe-order",
                         global_ranks=(0,), device="cpu")
    staging = HostStagingBackend(get_backend_spec("socket").create(ctx), arrays, chunk_bytes=256, depth=2)
    try:
        x = np.arange(64 * 5, dtype=np.float32)  # 5 chunks of 256 bytes through 2 slots
        assert Driver(staging).all_reduce(x, ReduceOp.SUM, blocking=True) is DONE
        np.testing.assert_array_equal(x, np.arange(64 * 5, dtype=np.float32))
    finally:
        staging.close()
    log, base = arrays.log, x.ctypes.data
    chunk = {}
    marks = {}  # mark -> what it follows: ("d2h"|"h2d", chunk)
    last = None
    for pos, entry in enumerate(log):
        if entry[0] in ("d2h", "h2d"):
            last = (entry[0], (entry[1] - base) // 256)
            chunk[last] = pos
            assert entry[3] == ("caller" if entry[0] == "d2h" else "side")
        elif entry[0] == "record":
            marks[entry[1]] = last
    # the copies back wait for what the caller enqueued before the call (a mark on its stream)
    assert log[0][0] == "record" and log[1] == ("stream_wait", "side", log[0][1])
    # chunks 0 and 1 are copied in ahead; chunk k's copy into slot k % 2 comes after the caller's
    # stream was made to wait for the copy out of that slot (chunk k - 2)
    for k in range(2, 5):
        waits = [e for e in log[:chunk[("d2h", k)]] if e[0] == "stream_wait" and e[1] == "caller"
                 and marks[e[2]] == ("h2d", k - 2)]
        assert waits, f"chunk {k} copied into its slot before the copy out of chunk {k - 2} was ordered"
    # each exchange waits on the host for its chunk's copy in: the wait comes before its copy out
    for k in range(5):
        host_waits = [e for e in log[:chunk[("h2d", k)]] if e[0] == "host_wait" and marks[e[1]] == ("d2h", k)]
        assert host_waits, k
    # the call returns after the host waited for the last copy out
    assert any(e[0] == "host_wait" and marks[e[1]] == ("h2d", 4) for e in log[chunk[("h2d", 4)]:])
