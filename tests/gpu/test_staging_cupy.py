"""CuPy arrays through the socket backend (HostStagingBackend) on 2-4 ranks sharing one GPU."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tests.gpu._gpu import require_gpu

cp = require_gpu()
pytest.importorskip("ndist.collectives.backends.socket")

from tests.backend_driver import Driver  # noqa: E402
from tests.backend_threads import run_backends  # noqa: E402
from ndist.collectives import ReduceOp  # noqa: E402
from ndist.collectives._staging import HostStagingBackend  # noqa: E402
from ndist.runtime import get_backend_spec  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]
_ids = itertools.count()


def run_staged(n, fn, timeout=60.0):
    return run_backends(n, lambda ctx: Driver(get_backend_spec("socket").create(ctx)), fn,  # (it stages CUDA arrays itself)
                        device="cuda", timeout=timeout, join=3, name=f"cupy-staging{next(_ids)}")


@pytest.mark.parametrize("n", [2, 3, 4])
def test_all_reduce_on_a_side_stream(n):
    def fn(be):
        assert isinstance(be.backend, HostStagingBackend)
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            x = cp.ones(1 << 16, dtype=cp.float32)
            x *= be.rank + 1  # enqueued on s before the collective: staging must wait for it
            be.all_reduce(x, ReduceOp.SUM).wait(60)
            y = x + 0  # after wait() the result is on the device
        s.synchronize()
        return float(y.min()), float(y.max())

    total = n * (n + 1) / 2
    assert run_staged(n, fn) == [(total, total)] * n


def test_every_op_moves_cupy_arrays():
    def fn(be):
        r, n = be.rank, be.size
        b = cp.arange(5, dtype=cp.complex64) if r == 0 else cp.zeros(5, dtype=cp.complex64)
        be.broadcast(b, 0).wait(60)
        outs = [cp.zeros(i + 1, dtype=cp.int16) for i in range(n)]
        be.all_gather(outs, cp.full(r + 1, r, dtype=cp.int16)).wait(60)
        rs = cp.zeros(2, dtype=cp.float64)
        be.reduce_scatter(rs, [cp.full(2, i + r, dtype=cp.float64) for i in range(n)], ReduceOp.MAX).wait(60)
        a_out = [cp.zeros(2, dtype=cp.int64) for _ in range(n)]
        be.all_to_all(a_out, [cp.full(2, 10 * r + j, dtype=cp.int64) for j in range(n)]).wait(60)
        if r == 0:
            be.send(cp.arange(3, dtype=cp.float32), 1, tag=3).wait(60)
            got = None
        elif r == 1:
            got = cp.zeros(3, dtype=cp.float32)
            assert be.recv(got, 0, tag=3).result() == [0]
        else:
            got = None
        return (cp.asnumpy(b), [cp.asnumpy(o) for o in outs], cp.asnumpy(rs), [cp.asnumpy(a) for a in a_out],
                None if got is None else cp.asnumpy(got))

    for r, (b, outs, rs, a_out, got) in enumerate(run_staged(3, fn)):
        np.testing.assert_array_equal(b, np.arange(5))
        for i, o in enumerate(outs):
            np.testing.assert_array_equal(o, np.full(i + 1, i))
        np.testing.assert_array_equal(rs, np.full(2, r + 2))
        for i, a in enumerate(a_out):
            np.testing.assert_array_equal(a, np.full(2, 10 * i + r))
        if r == 1:
            np.testing.assert_array_equal(got, np.arange(3))


def test_pinned_buffers_are_reused():
    def fn(be):
        for i in range(10):
            x = cp.full(4096, i, dtype=cp.float32)
            be.all_reduce(x, ReduceOp.SUM).wait(60)
        return be.pool.allocations

    assert run_staged(2, fn) == [1, 1]


def _cupy_ranks(rank, world_size):
    import cupy

    from ndist.collectives._staging import wrap_for_cuda as wrap
    from ndist.runtime import resolve_group

    be = Driver(wrap(resolve_group(None).backend_for("cpu")))
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        x = cupy.full(1 << 18, rank + 1, dtype=cupy.float64)
        be.all_reduce(x, ReduceOp.SUM).wait(60)
        outs = [cupy.zeros(i + 1, dtype=cupy.int32) for i in range(world_size)]
        be.all_gather(outs, cupy.full(rank + 1, rank, dtype=cupy.int32)).wait(60)
    s.synchronize()
    return float(x.min()), float(x.max()), [cupy.asnumpy(o).tolist() for o in outs]


@pytest.mark.parametrize("n", [2, 4])
def test_cupy_through_socket_in_separate_processes_sharing_one_gpu(n):
    from ndist.testing import run_ranks

    total = n * (n + 1) / 2
    for lo, hi, outs in run_ranks(_cupy_ranks, n, backend="socket", timeout=240):
        assert (lo, hi) == (total, total)
        assert outs == [[i] * (i + 1) for i in range(n)]


@pytest.mark.parametrize("n", [2, 3])
def test_pipelined_all_reduce_and_broadcast_on_a_side_stream(n):
    """Blocking ops go chunk by chunk through 3 slots: 5 MiB + 4 bytes is 5 chunks (4 of 1.25 MiB)."""
    def fn(be):
        staging = be.backend
        s = cp.cuda.Stream(non_blocking=True)
        count = (5 << 20) // 4 + 1
        with s:
            x = cp.arange(count, dtype=cp.float32)
            x += be.rank  # enqueued on s before the collective: its first chunk's copy waits for it
            be.all_reduce(x, ReduceOp.SUM, blocking=True)
            y = x + 0  # the call returned: every chunk is back on the device
            b = cp.arange(count, dtype=cp.int32) if be.rank == 0 else cp.zeros(count, dtype=cp.int32)
            be.broadcast(b, 0, blocking=True)
            slots = [id(a) for a in staging._slots]
            be.all_reduce(x, ReduceOp.SUM, blocking=True)
            assert [id(a) for a in staging._slots] == slots and len(slots) == 3
        s.synchronize()
        return cp.asnumpy(y), bool((b == cp.arange(count, dtype=cp.int32)).all()), staging.pool.allocations

    count = (5 << 20) // 4 + 1
    expected = (np.arange(count, dtype=np.float64) * n + n * (n - 1) / 2).astype(np.float32)
    for y, b_ok, allocations in run_staged(n, fn):
        np.testing.assert_array_equal(y, expected)
        assert b_ok and allocations == 0


def test_a_host_staged_op_on_a_capturing_stream_is_refused():
    from ndist.runtime import DistCaptureError

    def fn(be):
        x = cp.ones(1024, dtype=cp.float32)
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            s.begin_capture()
            try:
                with pytest.raises(DistCaptureError, match=r"all_reduce: a host-staged op is not allowed in CUDA "
                                                           r"graph capture: .*CPU"):
                    be.all_reduce(x, ReduceOp.SUM)
            finally:
                s.end_capture()
        be.all_reduce(x, ReduceOp.SUM, blocking=True)  # usable afterwards
        s.synchronize()
        return float(x.max())

    assert run_staged(2, fn) == [2.0, 2.0]
