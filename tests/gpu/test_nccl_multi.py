"""The nccl backend on 2+ GPUs: real reductions and data movement between ranks.

NCCL refuses two ranks on one GPU, so this module needs at least two devices.
Ranks are threads of one process, each with its own device and communicator
(NCCL supports this; it is how one process drives several GPUs).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu._gpu import require_gpu

cp = require_gpu(min_devices=2, nccl=True)

from tests.backend_driver import Driver  # noqa: E402
from tests.backend_threads import run_backends  # noqa: E402
from ndist.collectives import ReduceOp  # noqa: E402
from ndist.runtime import DistBackendError, DistTimeoutError, get_backend_spec  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]
N = 2


def run_nccl(fn, n=N, timeout=60.0):
    def on_device(be):
        out = fn(be)
        cp.cuda.get_current_stream().synchronize()
        return out

    return run_backends(n, lambda ctx: Driver(get_backend_spec("nccl").create(ctx)), on_device, device="cuda",
                        options=lambda r: {"device_id": r}, on_rank=cp.cuda.Device, timeout=timeout, join=3,
                        name="multi")


def host(x):
    return cp.asnumpy(x)


@pytest.mark.parametrize("dtype,op,expect", [
    ("float32", ReduceOp.SUM, lambda a, b: a + b),
    ("float64", ReduceOp.AVG, lambda a, b: (a + b) / 2),
    ("int16", ReduceOp.SUM, lambda a, b: (a + b).astype(np.int16)),
    ("uint16", ReduceOp.MAX, np.maximum),
    ("int64", ReduceOp.PRODUCT, lambda a, b: a * b),
    ("int8", ReduceOp.MIN, np.minimum),
    ("complex64", ReduceOp.SUM, lambda a, b: a + b),
    ("complex128", ReduceOp.AVG, lambda a, b: (a + b) / 2),
])
def test_all_reduce_values(dtype, op, expect):
    rng = np.random.default_rng(3)
    data = [rng.integers(-50, 50, 257).astype(dtype) if not dtype.startswith("u")
            else rng.integers(0, 60000, 257).astype(dtype) for _ in range(N)]
    if dtype.startswith("complex"):
        data = [d + 1j * d[::-1] for d in data]

    def fn(be):
        x = cp.asarray(data[be.rank])
        be.all_reduce(x, op).wait()
        return host(x)

    for out in run_nccl(fn):
        np.testing.assert_allclose(out, expect(data[0], data[1]), rtol=1e-6)


@pytest.mark.parametrize("op,expect", [(ReduceOp.SUM, [True, True, False]), (ReduceOp.PRODUCT, [True, False, False]),
                                       (ReduceOp.BOR, [True, True, False]), (ReduceOp.BAND, [True, False, False])])
def test_bool_all_reduce_is_logical(op, expect):
    flags = [[True, True, False], [True, False, False]]

    def fn(be):
        x = cp.asarray(flags[be.rank])
        be.all_reduce(x, op).wait()
        return host(x)

    for out in run_nccl(fn):
        assert out.tolist() == expect


def test_premul_sum_and_reduce_leaves_non_root_unchanged():
    def fn(be):
        x = cp.full(5, be.rank + 1, dtype=cp.float32)
        be.all_reduce(x, ReduceOp.PREMUL_SUM, scale=0.5).wait()
        y = cp.full(3, be.rank + 1, dtype=cp.int16)
        be.reduce(y, 0, ReduceOp.SUM).wait()
        return host(x), host(y)

    (x0, y0), (x1, y1) = run_nccl(fn)
    np.testing.assert_array_equal(x0, np.full(5, 1.5))
    np.testing.assert_array_equal(x1, np.full(5, 1.5))
    np.testing.assert_array_equal(y0, [3, 3, 3])
    np.testing.assert_array_equal(y1, [2, 2, 2])


@pytest.mark.parametrize("layout", ["adjacent", "separate", "uneven"])
def test_reduce_scatter(layout):
    sizes = [2, 5] if layout == "uneven" else [4, 4]

    def fn(be):
        if layout == "adjacent":
            flat = cp.arange(8, dtype=cp.float32) + be.rank
            inputs = [flat[:4], flat[4:]]
        else:
            inputs = [cp.full(s, 10 * i + be.rank, dtype=cp.float32) for i, s in enumerate(sizes)]
        out = cp.zeros(sizes[be.rank], dtype=cp.float32)
        be.reduce_scatter(out, inputs, ReduceOp.SUM).wait()
        return host(out)

    outs = run_nccl(fn)
    if layout == "adjacent":
        np.testing.assert_array_equal(outs[0], np.arange(4) * 2 + 1)
        np.testing.assert_array_equal(outs[1], np.arange(4, 8) * 2 + 1)
    else:
        for r, out in enumerate(outs):
            np.testing.assert_array_equal(out, np.full(sizes[r], 20 * r + 1))


@pytest.mark.parametrize("layout", ["adjacent", "separate", "uneven"])
def test_all_gather(layout):
    def fn(be):
        n = 3 if layout != "uneven" else be.rank + 1
        inp = cp.full(n, be.rank + 1, dtype=cp.complex64)
        if layout == "adjacent":
            big = cp.zeros((N, 3), dtype=cp.complex64)
            outputs = [big[0], big[1]]
        else:
            outputs = [cp.zeros(3 if layout != "uneven" else i + 1, dtype=cp.complex64) for i in range(N)]
        be.all_gather(outputs, inp).wait()
        return [host(o) for o in outputs]

    for outs in run_nccl(fn):
        for i, o in enumerate(outs):
            np.testing.assert_array_equal(o, np.full(o.size, i + 1))


def test_broadcast_gather_scatter_all_to_all():
    def fn(be):
        r = be.rank
        b = cp.arange(6, dtype=cp.int16) if r == 1 else cp.zeros(6, dtype=cp.int16)
        be.broadcast(b, 1).wait()
        mine = cp.full(r + 2, r, dtype=cp.float64)
        gl = [cp.zeros(i + 2) for i in range(N)] if r == 0 else None
        be.gather(gl, mine, 0).wait()
        out = cp.zeros(r + 1, dtype=cp.uint8)
        sl = [cp.full(i + 1, 7 * i + 1, dtype=cp.uint8) for i in range(N)] if r == 1 else None
        be.scatter(out, sl, 1).wait()
        # rank r sends r + j elements to j; 0 elements from rank 0 to rank 0
        a_in = [cp.full(r + j, 10 * r + j, dtype=cp.int32) for j in range(N)]
        a_out = [cp.zeros(i + r, dtype=cp.int32) for i in range(N)]
        be.all_to_all(a_out, a_in).wait()
        be.barrier().wait()
        return host(b), None if gl is None else [host(g) for g in gl], host(out), [host(a) for a in a_out]

    for r, (b, gl, out, a_out) in enumerate(run_nccl(fn)):
        np.testing.assert_array_equal(b, np.arange(6))
        if r == 0:
            for i, g in enumerate(gl):
                np.testing.assert_array_equal(g, np.full(i + 2, i))
        np.testing.assert_array_equal(out, np.full(r + 1, 7 * r + 1))
        for i, a in enumerate(a_out):
            np.testing.assert_array_equal(a, np.full(i + r, 10 * i + r))


def test_send_recv_between_ranks_in_issue_order():
    def fn(be):
        if be.rank == 0:
            be.send(cp.arange(4, dtype=cp.float32), 1)
            be.send(cp.arange(4, dtype=cp.float32) * 2, 1)
            return None
        a, b = cp.zeros(4, dtype=cp.float32), cp.zeros(4, dtype=cp.float32)
        w = be.recv(a, 0)
        be.recv(b, 0).wait()
        assert w.result() == [0]
        return host(a), host(b)

    _, (a, b) = run_nccl(fn)
    np.testing.assert_array_equal(a, np.arange(4))
    np.testing.assert_array_equal(b, np.arange(4) * 2)


def test_coalesced_exchange_in_both_directions():
    # Both ranks send first, then receive: without one NCCL group this order deadlocks.
    def fn(be):
        peer = 1 - be.rank
        out = cp.full(1 << 16, be.rank + 1, dtype=cp.float32)
        got = cp.zeros(1 << 16, dtype=cp.float32)
        with be.coalescing():
            be.send(out, peer)
            w = be.recv(got, peer)
        w.wait()
        return float(got.min()), float(got.max())

    assert run_nccl(fn) == [(2.0, 2.0), (1.0, 1.0)]


def test_missing_peer_times_out_and_aborts():
    def fn(be):
        if be.rank == 1:
            return None  # never joins the all_reduce
        work = be.all_reduce(cp.ones(4, dtype=cp.float32), ReduceOp.SUM)
        with pytest.raises(DistTimeoutError, match="all_reduce"):
            work.wait(60)
        with pytest.raises(DistBackendError, match="aborted"):
            be.all_reduce(cp.ones(4, dtype=cp.float32), ReduceOp.SUM)
        return None

    run_nccl(fn, timeout=3.0)


def test_array_on_another_device_is_rejected():
    def fn(be):
        with cp.cuda.Device(1 - be.rank):
            other = cp.ones(2)
        with pytest.raises(ValueError, match=f"cuda:{be.rank}"):
            be.all_reduce(other, ReduceOp.SUM)
        be.barrier().wait()

    run_nccl(fn)


def _api_ranks(rank, world_size):
    import cupy

    import ndist.distributed as dist

    cupy.cuda.Device(rank).use()
    dist.init_process_group(backend="cpu:socket,cuda:nccl")
    try:
        peer = 1 - rank
        out = cupy.full(1 << 16, rank + 1, dtype=cupy.float32)
        got = cupy.zeros(1 << 17, dtype=cupy.float32)[::2]  # non-contiguous: written back after the recv
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, out, peer), dist.P2POp(dist.irecv, got, peer)])
        for w in works:
            w.wait()
        x = cupy.full(8, rank + 1, dtype=cupy.float64)
        dist.all_reduce(x)  # returns after enqueue; the stream orders what follows
        y = x * 2
        cupy.cuda.get_current_stream().synchronize()
        return float(got.min()), float(got.max()), cupy.asnumpy(y).tolist(), dist.get_backend()
    finally:
        dist.destroy_process_group()


def test_public_api_on_two_gpus_batch_exchange_and_sync_all_reduce():
    from ndist.testing import run_ranks

    res = run_ranks(_api_ranks, 2, init=False, timeout=240)
    assert res[0][:2] == (2.0, 2.0) and res[1][:2] == (1.0, 1.0)
    assert res[0][2] == res[1][2] == [6.0] * 8
    assert res[0][3] == "cpu:socket,cuda:nccl"
