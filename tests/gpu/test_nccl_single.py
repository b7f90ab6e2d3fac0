"""The nccl backend at world size 1: every Backend op, dtype handling, Work and streams.

NCCL refuses two ranks on one GPU, so on a single-GPU machine the backend is
exercised at world size 1 (multi-GPU tests are in test_nccl_multi.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu._gpu import nccl_fixture, require_gpu, single_rank_nccl

cp = require_gpu(nccl=True)

from ndist.collectives import ReduceOp  # noqa: E402
from ndist.runtime import DistBackendError, get_backend_spec  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]

REDUCE_OPS = [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG]
NUMERIC = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32",
           "float64"]


be = nccl_fixture("gpu-single", scope="module")


def _data(dtype, n=1000, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return cp.asarray(rng.integers(0, 2, n).astype(bool))
    if dtype.startswith("complex"):
        return cp.asarray((rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype))
    return cp.asarray(rng.integers(1, 5, n).astype(dtype))


def test_is_available_and_registered_for_cuda():
    spec = get_backend_spec("nccl")
    assert spec.devices == ("cuda",)
    assert spec.available() is True


@pytest.mark.parametrize("dtype", NUMERIC)
@pytest.mark.parametrize("op", REDUCE_OPS, ids=lambda o: o.name)
def test_all_reduce_single_rank_is_identity(be, dtype, op):
    x = _data(dtype)
    expected = x.copy()
    be.all_reduce(x, op).wait()
    cp.cuda.get_current_stream().synchronize()
    cp.testing.assert_array_equal(x, expected)


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128", "int32"])
def test_premul_sum_scales(be, dtype):
    x = _data(dtype)
    expected = (x * 3).astype(dtype)
    be.all_reduce(x, ReduceOp.PREMUL_SUM, scale=3).synchronize()
    cp.testing.assert_allclose(x, expected)


def test_premul_sum_with_device_scalar_factor(be):
    x = cp.arange(10, dtype=cp.float32)
    be.all_reduce(x, ReduceOp.PREMUL_SUM, scale=cp.asarray(0.5, dtype=cp.float32)).synchronize()
    cp.testing.assert_allclose(x, cp.arange(10, dtype=cp.float32) * 0.5)


@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.BAND,
                                ReduceOp.BOR], ids=lambda o: o.name)
def test_bool_reductions_through_uint8(be, op):
    x = _data("bool")
    expected = x.copy()
    be.all_reduce(x, op).synchronize()
    assert x.dtype == cp.bool_
    cp.testing.assert_array_equal(x, expected)


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.AVG], ids=lambda o: o.name)
def test_complex_sum_and_avg_as_real_pairs(be, dtype, op):
    x = _data(dtype)
    expected = x.copy()
    be.all_reduce(x, op).synchronize()
    cp.testing.assert_array_equal(x, expected)


@pytest.mark.parametrize("dtype,op", [("complex64", ReduceOp.MAX), ("complex128", ReduceOp.PRODUCT),
                                      ("int32", ReduceOp.BAND), ("int64", ReduceOp.BXOR),
                                      ("bool", ReduceOp.AVG)])
def test_unsupported_reductions_raise_before_enqueue(be, dtype, op):
    x = _data(dtype)
    with pytest.raises(ValueError, match=op.name):
        be.all_reduce(x, op)


def test_host_array_is_rejected(be):
    with pytest.raises(TypeError, match="CuPy"):
        be.all_reduce(np.ones(3, np.float32), ReduceOp.SUM)


def test_zero_d_and_empty_arrays(be):
    x = cp.asarray(4.0, dtype=cp.float32)
    be.all_reduce(x, ReduceOp.PREMUL_SUM, scale=2.0).synchronize()
    assert float(x) == 8.0
    e = cp.empty((0, 3), dtype=cp.float32)
    assert be.all_reduce(e, ReduceOp.SUM).wait() is True


@pytest.mark.parametrize("dtype", ["float32", "int16", "complex64", "bool"])
def test_reduce_to_self(be, dtype):
    x = _data(dtype)
    expected = x.copy()
    be.reduce(x, 0, ReduceOp.SUM if dtype != "bool" else ReduceOp.MAX).synchronize()
    cp.testing.assert_array_equal(x, expected)


@pytest.mark.parametrize("adjacent", [True, False])
def test_reduce_scatter_even(be, adjacent):
    if adjacent:
        flat = cp.arange(8, dtype=cp.float32)
        inputs = [flat[0:8]]
    else:
        inputs = [cp.arange(8, dtype=cp.float32)]
    out = cp.zeros(8, dtype=cp.float32)
    be.reduce_scatter(out, inputs, ReduceOp.PREMUL_SUM, scale=2).synchronize()
    cp.testing.assert_array_equal(out, cp.arange(8, dtype=cp.float32) * 2)
    cp.testing.assert_array_equal(inputs[0], cp.arange(8, dtype=cp.float32))  # inputs untouched


def test_reduce_scatter_int16_upcast(be):
    inp = cp.asarray([30000, -30000, 7], dtype=cp.int16)
    out = cp.zeros(3, dtype=cp.int16)
    be.reduce_scatter(out, [inp], ReduceOp.SUM).synchronize()
    cp.testing.assert_array_equal(out, inp)


@pytest.mark.parametrize("dtype", ["float32", "int16", "complex128", "bool", "uint64"])
def test_broadcast_moves_any_dtype(be, dtype):
    x = _data(dtype)
    expected = x.copy()
    be.broadcast(x, 0).synchronize()
    cp.testing.assert_array_equal(x, expected)


@pytest.mark.parametrize("layout", ["adjacent", "separate"])
def test_all_gather_even(be, layout):
    inp = cp.arange(6, dtype=cp.int16).reshape(2, 3)
    if layout == "adjacent":
        out = cp.zeros((1, 2, 3), dtype=cp.int16)
        outputs = [out[0]]
    else:
        outputs = [cp.zeros((2, 3), dtype=cp.int16)]
    be.all_gather(outputs, inp).synchronize()
    cp.testing.assert_array_equal(outputs[0], inp)


def test_gather_scatter_all_to_all_self(be):
    inp = cp.arange(5, dtype=cp.complex64)
    out = [cp.zeros(5, dtype=cp.complex64)]
    be.gather(out, inp, 0).synchronize()
    cp.testing.assert_array_equal(out[0], inp)

    dst = cp.zeros(4, dtype=cp.float64)
    be.scatter(dst, [cp.full(4, 7.0)], 0).synchronize()
    cp.testing.assert_array_equal(dst, cp.full(4, 7.0))

    a2a_out = [cp.zeros(3, dtype=cp.int64)]
    be.all_to_all(a2a_out, [cp.arange(3, dtype=cp.int64)]).synchronize()
    cp.testing.assert_array_equal(a2a_out[0], cp.arange(3))

    empty_out = [cp.zeros(0, dtype=cp.int64)]
    assert be.all_to_all(empty_out, [cp.zeros(0, dtype=cp.int64)]).wait() is True


def test_send_recv_to_self_matches_tags_in_order(be):
    a = cp.arange(4, dtype=cp.float32)
    b = cp.arange(4, dtype=cp.float32) + 10
    be.send(a, 0, tag=1)
    be.send(b, 0, tag=2)
    a += 100  # the send copied a at enqueue time
    got_b = cp.zeros(4, dtype=cp.float32)
    got_a = cp.zeros(4, dtype=cp.float32)
    w = be.recv(got_b, 0, tag=2)
    be.recv(got_a, 0, tag=1).synchronize()
    w.synchronize()
    assert w.result() == [0]
    cp.testing.assert_array_equal(got_b, b)
    cp.testing.assert_array_equal(got_a, cp.arange(4, dtype=cp.float32))


def test_recv_without_pending_self_send_raises(be):
    with pytest.raises(DistBackendError, match="no send to self"):
        be.recv(cp.zeros(2), 0, tag=99)


def test_recv_any_source_not_implemented(be):
    with pytest.raises(NotImplementedError, match="any source"):
        be.recv(cp.zeros(2), None)


def test_barrier_completes(be):
    w = be.barrier()
    assert w.is_completed() and w.is_success()


def test_ops_on_a_side_stream_are_ordered_after_its_kernels(be):
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        x = cp.ones(1 << 22, dtype=cp.float32)
        for _ in range(20):
            x *= 1.0
        x += 1  # 2.0 everywhere, enqueued before the collective on s
        work = be.all_reduce(x, ReduceOp.PREMUL_SUM, scale=3.0)
    # Another stream that waits on the Work sees the result.
    other = cp.cuda.Stream(non_blocking=True)
    with other:
        work.wait()
        y = x + 1
    other.synchronize()
    assert float(y.min()) == 7.0 and float(y.max()) == 7.0
    work.get_future().result(timeout=60)  # raises if the work failed
    assert work.is_completed() and work.is_success()


def test_async_work_future_resolves_and_synchronize_blocks(be):
    x = cp.arange(1 << 20, dtype=cp.float64)
    work = be.all_reduce(x, ReduceOp.SUM)
    work.synchronize()
    assert work.is_completed()
    work.get_future().result(timeout=30)
    assert work.exception() is None


def test_then_write_back_is_stream_ordered(be):
    x = cp.arange(8, dtype=cp.float32)
    target = cp.zeros(16, dtype=cp.float32)[::2]  # non-contiguous destination
    work = be.all_reduce(x, ReduceOp.PREMUL_SUM, scale=2.0)
    chained = work.then(lambda: target.__setitem__(Ellipsis, x))
    chained.wait(30)  # host-blocking with a timeout
    cp.testing.assert_array_equal(target, cp.arange(8, dtype=cp.float32) * 2)


def test_options_select_the_device():
    backend = single_rank_nccl("gpu-options", options={"device_id": 0})
    try:
        x = cp.ones(4, dtype=cp.float32)
        backend.all_reduce(x, ReduceOp.SUM).synchronize()
        assert backend._dev_id == 0
    finally:
        backend.close()


def test_closed_backend_refuses_ops():
    backend = single_rank_nccl("gpu-closed")
    backend.close()
    backend.close()  # idempotent
    with pytest.raises(DistBackendError, match="closed"):
        backend.all_reduce(cp.ones(2), ReduceOp.SUM)


def test_close_inside_an_open_coalescing_block_fails_its_works():
    backend = single_rank_nccl("gpu-close-in-block")
    a, got = cp.arange(3, dtype=cp.float32), cp.zeros(3, dtype=cp.float32)
    with backend.coalescing():
        ws = backend.send(a, 0, tag=1)
        wr = backend.recv(got, 0, tag=1)
        backend.close()  # these works have no event yet: failed, not read
    for w in (ws, wr):
        with pytest.raises(DistBackendError, match="closed"):
            w.wait()


def test_ndist_cuda_stream_is_where_the_op_runs(be):
    import ndist

    s = ndist.cuda.Stream()
    with ndist.cuda.stream(s):
        x = cp.full(1 << 20, 2.0, dtype=cp.float32)
        work = be.all_reduce(x, ReduceOp.PREMUL_SUM, scale=2.0)
    s.synchronize()  # the Work's event was recorded on s, so it has fired
    assert work.is_completed() and work.is_success()
    assert float(x[0]) == 4.0


def test_coalescing_groups_self_send_recv_and_refuses_collectives(be):
    a = cp.arange(5, dtype=cp.float32)
    got = cp.zeros(5, dtype=cp.float32)
    with be.coalescing():
        ws = be.send(a, 0, tag=4)
        wr = be.recv(got, 0, tag=4)
        with pytest.raises(RuntimeError, match="inside the coalescing block"):
            wr.wait()
        assert not wr.is_completed()
        with pytest.raises(RuntimeError, match="only send and recv"):
            be.all_reduce(cp.ones(2), ReduceOp.SUM)
    wr.synchronize()
    ws.synchronize()
    cp.testing.assert_array_equal(got, a)
    with pytest.raises(RuntimeError, match="nested"):
        with be.coalescing():
            with be.coalescing():
                pass


def test_then_inside_coalescing_runs_after_the_group(be):
    a = cp.arange(6, dtype=cp.float32)
    got = cp.zeros(6, dtype=cp.float32)
    target = cp.zeros(12, dtype=cp.float32)[::2]
    with be.coalescing():
        be.send(a, 0, tag=8)
        w = be.recv(got, 0, tag=8)
        chained = w.then(lambda: target.__setitem__(Ellipsis, got))
        assert not chained.is_completed()
    chained.synchronize()
    w.synchronize()
    cp.testing.assert_array_equal(target, a)
