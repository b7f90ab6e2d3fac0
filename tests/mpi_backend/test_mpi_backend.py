"""The MPI backend driven directly (contiguous arrays in, Work out), at any -n."""

from datetime import timedelta

import numpy as np
import pytest

from ndist.collectives import ReduceOp
from ndist.runtime import BackendContext, DistTimeoutError, Work

pytestmark = [pytest.mark.mpi(min_size=1), pytest.mark.timeout(60)]


def _backend(comm, ranks=None, name="world"):
    from ndist.collectives.backends.mpi._backend import MPIBackend

    ranks = tuple(range(comm.size)) if ranks is None else tuple(ranks)
    from tests.backend_driver import Driver

    ctx = BackendContext(None, ranks.index(comm.rank), len(ranks), timedelta(seconds=30), name, ranks, "cpu")
    return Driver(MPIBackend(ctx))


@pytest.fixture(scope="module")
def be(comm):
    backend = _backend(comm)
    yield backend
    backend.close()


def _vals(rank, n, dtype):
    return (np.arange(n) % 3 + rank + 1).astype(dtype)


@pytest.mark.parametrize("blocking", [True, False])
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64", "float16", "float32", "float64",
                                   "complex64", "complex128"])
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MAX, ReduceOp.AVG])
def test_all_reduce_matches_numpy(be, comm, dtype, op, blocking):
    dt = np.dtype(dtype)
    if op is ReduceOp.MAX and dt.kind == "c":
        pytest.skip("rejected by the argument checker before reaching a backend")
    buf = _vals(be.rank, 5, dt)
    stack = np.stack([_vals(r, 5, dt) for r in range(be.size)]).astype(np.complex128 if dt.kind == "c" else np.float64)
    want = {ReduceOp.SUM: stack.sum(0), ReduceOp.PRODUCT: stack.prod(0), ReduceOp.MAX: stack.max(0),
            ReduceOp.AVG: stack.mean(0)}[op]
    work = be.all_reduce(buf, op, blocking=blocking)
    assert isinstance(work, Work)
    work.wait()
    if dt.kind in "iu":
        np.testing.assert_array_equal(buf, want.astype(dt))  # wraps like the dtype does
    else:
        np.testing.assert_allclose(buf.astype(want.dtype), want, rtol=1e-2 if dt == np.float16 else 1e-6)


@pytest.mark.parametrize("op,want", [(ReduceOp.SUM, np.logical_or), (ReduceOp.PRODUCT, np.logical_and),
                                     (ReduceOp.BXOR, np.logical_xor)])
def test_bool_reductions(be, comm, op, want):
    mine = np.array([be.rank % 2 == 0, True, False, be.rank == 0])
    buf = mine.copy()
    be.all_reduce(buf, op).wait()
    rows = comm.allgather(mine)
    expect = rows[0]
    for row in rows[1:]:
        expect = want(expect, row)
    np.testing.assert_array_equal(buf, expect)


def test_premul_sum_scales_then_sums(be):
    buf = np.full(3, be.rank + 1, np.float32)
    be.all_reduce(buf, ReduceOp.PREMUL_SUM, scale=0.5, blocking=True).wait()
    np.testing.assert_allclose(buf, 0.5 * sum(range(1, be.size + 1)))


def test_reduce_leaves_non_root_buffers(be):
    root = be.size - 1
    buf = np.full(4, be.rank + 1.0)
    before = buf.copy()
    be.reduce(buf, root, ReduceOp.PREMUL_SUM, scale=2.0).wait()
    if be.rank == root:
        np.testing.assert_allclose(buf, 2.0 * sum(range(1, be.size + 1)))
    else:
        np.testing.assert_array_equal(buf, before)


@pytest.mark.parametrize("blocking", [True, False])
def test_uneven_all_to_all_packed_and_flat(be, blocking):
    n = be.size
    # rank r sends r + j + 1 items to rank j (zero-size when n is 1 and never otherwise)
    inputs = [np.full(be.rank + j, 100 * be.rank + j, np.int64) for j in range(n)]
    outputs = [np.empty(i + be.rank, np.int64) for i in range(n)]
    be.all_to_all(outputs, inputs, blocking=blocking).wait()
    for i, out in enumerate(outputs):
        np.testing.assert_array_equal(out, np.full(i + be.rank, 100 * i + be.rank))
    # the same through the single-buffer form (what all_to_all_single passes): one Alltoallv
    flat_out = np.empty(sum(i + be.rank for i in range(n)), np.int64)
    flat_in = np.concatenate(inputs)
    be.all_to_all_single(flat_out, flat_in, [i + be.rank for i in range(n)], [be.rank + j for j in range(n)],
                         blocking=blocking).wait()
    np.testing.assert_array_equal(np.concatenate([o for o in outputs]), flat_out)


@pytest.mark.parametrize("blocking", [True, False])
def test_even_single_buffer_forms(be, blocking):
    """No splits: MPI_Alltoall / Allgather / Reduce_scatter_block on the caller's buffers."""
    n, r = be.size, be.rank
    inp = np.arange(3 * n, dtype=np.float64) + 100 * r
    out = np.empty(3 * n)
    be.all_to_all_single(out, inp, blocking=blocking).wait()
    np.testing.assert_array_equal(out, np.concatenate([np.arange(3 * r, 3 * r + 3) + 100 * s for s in range(n)]))
    gathered = np.empty(2 * n, np.int32)
    be.all_gather_into(gathered, np.full(2, r, np.int32), blocking=blocking).wait()
    np.testing.assert_array_equal(gathered, np.repeat(np.arange(n, dtype=np.int32), 2))
    mine = np.empty(2, np.int64)
    be.reduce_scatter_from(mine, np.arange(2 * n, dtype=np.int64), ReduceOp.SUM, blocking=blocking).wait()
    np.testing.assert_array_equal(mine, n * np.arange(2 * r, 2 * r + 2))


def test_bfloat16_moves_as_bytes(be):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    data = np.arange(4, dtype=np.float32).astype(ml_dtypes.bfloat16) + be.rank
    outs = [np.zeros(4, ml_dtypes.bfloat16) for _ in range(be.size)]
    be.all_gather(outs, data).wait()
    for r, out in enumerate(outs):
        np.testing.assert_array_equal(out.astype(np.float32), np.arange(4, dtype=np.float32) + r)
    buf = data.copy()
    be.all_reduce(buf, ReduceOp.SUM).wait()
    want = sum(np.arange(4, dtype=np.float32) + r for r in range(be.size))
    np.testing.assert_allclose(buf.astype(np.float32), want, rtol=1e-2)


def test_gather_scatter_uneven(be):
    root = 0
    mine = np.arange(be.rank + 1, dtype=np.float64) + 10 * be.rank
    outs = [np.empty(r + 1) for r in range(be.size)] if be.rank == root else None
    be.gather(outs, mine, root).wait()
    if be.rank == root:
        for r, out in enumerate(outs):
            np.testing.assert_array_equal(out, np.arange(r + 1) + 10 * r)
    got = np.empty(be.rank + 2, np.int16)
    ins = [np.full(r + 2, r, np.int16) for r in range(be.size)] if be.rank == root else None
    be.scatter(got, ins, root, blocking=False).wait()
    np.testing.assert_array_equal(got, np.full(be.rank + 2, be.rank))


def test_reduce_scatter_avg(be):
    inputs = [np.full(r + 1, float(be.rank), np.float32) for r in range(be.size)]
    out = np.empty(be.rank + 1, np.float32)
    be.reduce_scatter(out, inputs, ReduceOp.AVG).wait()
    np.testing.assert_allclose(out, np.mean(range(be.size)))


@pytest.mark.mpi(min_size=2)
def test_send_recv_any_source_reports_sender(be):
    if be.rank == 1:
        be.send(np.arange(3, dtype=np.int32) * 7, 0, tag=5).wait()
    elif be.rank == 0:
        buf = np.zeros(3, np.int32)
        work = be.recv(buf, None, tag=5)
        assert work.result() == [1]
        np.testing.assert_array_equal(buf, [0, 7, 14])


@pytest.mark.mpi(min_size=2)
def test_async_work_progress_and_timeout(be):
    if be.rank == 0:
        buf = np.zeros(2)
        work = be.recv(buf, 1, tag=9)
        assert not work.is_completed()
        assert work.exception() is None
        with pytest.raises(DistTimeoutError, match="recv"):
            work.wait(timeout=0.05)
        be.send(np.ones(1), 1, tag=10, blocking=True).wait()   # now let rank 1 send
        chained = work.then(lambda: buf.__imul__(2))
        chained.wait()
        assert work.is_completed() and work.is_success()
        np.testing.assert_array_equal(buf, [6, 6])
    elif be.rank == 1:
        be.recv(np.zeros(1), 0, tag=10, blocking=True).wait()
        be.send(np.full(2, 3.0), 0, tag=9).wait()


def test_subgroup_communicator(comm):
    even = [r for r in range(comm.size) if r % 2 == 0]
    if comm.rank not in even:
        return
    sub = _backend(comm, even, name="even")
    try:
        assert sub.comm.Get_size() == len(even)
        buf = np.array([comm.rank], np.int64)
        sub.all_reduce(buf, ReduceOp.SUM).wait()
        assert buf[0] == sum(even)
        sub.barrier().wait()
    finally:
        sub.close()


@pytest.mark.mpi(min_size=2)
def test_is_completed_does_not_block_behind_get_future(be):
    if be.rank == 0:
        buf = np.zeros(1)
        work = be.recv(buf, 1, tag=11)
        fut = work.get_future()           # a helper thread now blocks in Request.Wait
        assert not fut.done()
        assert work.is_completed() is False  # returns at once instead of waiting for the lock
        be.send(np.ones(1), 1, tag=12, blocking=True).wait()
        assert fut.result(timeout=30) == [1]
        assert work.is_completed() and buf[0] == 5
    elif be.rank == 1:
        be.recv(np.zeros(1), 0, tag=12, blocking=True).wait()
        be.send(np.full(1, 5.0), 0, tag=11, blocking=True).wait()
