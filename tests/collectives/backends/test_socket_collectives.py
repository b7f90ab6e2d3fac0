"""Socket backend collectives: every op, dtype and reduction, both transports,
world sizes 1-4 (ranks are threads with their own real sockets and shm)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from ndist.collectives import ReduceOp

from tests.collectives.backends._socket_bodies import gather_scatter, uneven_exchanges
from tests.collectives.backends._socket_threads import run_group

try:
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None

TRANSPORTS = ["tcp", "shm"]
SIZES = [1, 2, 3, 4]
pytestmark = pytest.mark.timeout(120)


def _data(rank, count, dtype, seed=0):
    rng = np.random.default_rng(1000 * seed + rank)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, count).astype(bool)
    if dt.kind in "iu":
        return rng.integers(0, 7 if dt.itemsize == 1 else 50, count).astype(dt)
    if dt.kind == "c":
        return (rng.integers(-5, 5, count) + 1j * rng.integers(-5, 5, count)).astype(dt)
    return rng.integers(-8, 8, count).astype(dt)


def _expected(arrays, op, scale=None):
    n = len(arrays)
    f = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PREMUL_SUM: np.add, ReduceOp.PRODUCT: np.multiply,
         ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum, ReduceOp.BAND: np.bitwise_and,
         ReduceOp.BOR: np.bitwise_or, ReduceOp.BXOR: np.bitwise_xor}[op]
    acc = arrays[0].copy()
    for a in arrays[1:]:
        acc = f(acc, a).astype(acc.dtype)
    if op == ReduceOp.AVG:
        if acc.dtype.kind in "iu":
            acc = (np.trunc(acc.astype(np.float64) / n)).astype(acc.dtype)
        else:
            acc = (acc / n).astype(acc.dtype)
    if op == ReduceOp.PREMUL_SUM:
        acc = (acc * scale).astype(acc.dtype)
    return acc


DTYPES = ["bool", "int8", "uint8", "int32", "int64", "float16", "float32", "float64", "complex64", "complex128"]


def _ops_for(dtype):
    kind = np.dtype(dtype).kind
    ops = [ReduceOp.SUM, ReduceOp.PRODUCT]
    if kind != "c":
        ops += [ReduceOp.MIN, ReduceOp.MAX]
    if kind in "biu":
        ops += [ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR]
    if kind != "b":
        ops += [ReduceOp.AVG, ReduceOp.PREMUL_SUM]
    return ops


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce_every_op_and_dtype(transport, n, dtype):
    ops = _ops_for(dtype)

    def fn(b):
        for i, op in enumerate(ops):
            for count in (5, 40000):  # inline and (shm) segment payloads
                x = _data(b.rank, count, dtype, seed=i)
                scale = 3 if op == ReduceOp.PREMUL_SUM else None
                b.all_reduce(x, op, scale, blocking=True).wait()
                exp = _expected([_data(r, count, dtype, seed=i) for r in range(n)], op, scale)
                assert x.dtype == np.dtype(dtype)
                np.testing.assert_array_equal(x, exp, err_msg=f"{op} {dtype} count={count}")
    run_group(n, fn, transport)


def test_bool_semantics_follow_torch():
    def fn(b):
        a = np.array([True, True, False, False]) if b.rank == 0 else np.array([True, False, True, False])
        res = {}
        for op in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.PRODUCT, ReduceOp.MIN):
            x = a.copy()
            b.all_reduce(x, op, blocking=True).wait()
            res[op] = x.tolist()
        return res
    res = run_group(2, fn)[0]
    assert res[ReduceOp.SUM] == res[ReduceOp.MAX] == [True, True, True, False]
    assert res[ReduceOp.PRODUCT] == res[ReduceOp.MIN] == [True, False, False, False]


def test_avg_on_integers_truncates_toward_zero():
    def fn(b):
        x = np.array([-7, 7, -1, 4], np.int32) if b.rank == 0 else np.array([0, 0, 0, 1], np.int32)
        b.all_reduce(x, ReduceOp.AVG, blocking=True).wait()
        return x.tolist()
    assert run_group(2, fn)[0] == [-3, 3, 0, 2]


@pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes missing")
def test_bfloat16_sum():
    def fn(b):
        x = np.arange(100, dtype=np.float32).astype(ml_dtypes.bfloat16)
        b.all_reduce(x, ReduceOp.SUM, blocking=True).wait()
        return x.astype(np.float32)
    out = run_group(2, fn)
    np.testing.assert_array_equal(out[0], (np.arange(100, dtype=np.float32).astype(ml_dtypes.bfloat16)
                                           .astype(np.float32) * 2).astype(ml_dtypes.bfloat16).astype(np.float32))


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("n", SIZES)
def test_large_all_reduce_rs_ag_identical_on_every_rank(transport, n):
    count = 300_001  # > DIRECT_MAX bytes, not divisible by n

    def fn(b):
        x = np.random.default_rng(b.rank).standard_normal(count).astype(np.float32)
        b.all_reduce(x, ReduceOp.SUM, blocking=True).wait()
        return x
    out = run_group(n, fn, transport)
    ref = np.random.default_rng(0).standard_normal(count).astype(np.float32)
    for r in range(1, n):
        ref = ref + np.random.default_rng(r).standard_normal(count).astype(np.float32)
    for r in range(n):
        assert np.array_equal(out[r], out[0]), "ranks disagree bitwise"
    np.testing.assert_allclose(out[0], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("count", [0, 3, 50000])
def test_data_movement(transport, n, count):
    def fn(b):
        r = b.rank
        # broadcast from every root
        for src in range(n):
            x = np.full(count, r, np.int64)
            b.broadcast(x, src, blocking=True).wait()
            assert (x == src).all()
        # reduce to every root: non-roots unchanged
        for dst in range(n):
            x = np.full(count, r + 1, np.float64)
            b.reduce(x, dst, ReduceOp.SUM, blocking=True).wait()
            assert (x == (n * (n + 1) // 2 if r == dst else r + 1)).all()
        # uneven all_gather (rank i contributes count+i elements)
        outs = [np.empty(count + i, np.int32) for i in range(n)]
        b.all_gather(outs, np.full(count + r, r, np.int32), blocking=True).wait()
        assert all((outs[i] == i).all() for i in range(n))
        # gather / scatter, uneven, every root
        for root in range(n):
            gather_scatter(b, root, count, base=10)
        # uneven all_to_all with zero sizes, then reduce_scatter with uneven blocks
        uneven_exchanges(b, count, np.float32, 100)
        b.barrier(blocking=True).wait()
    run_group(n, fn, transport)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_async_ops_complete_in_issue_order(transport):
    n = 3

    def fn(b):
        works, bufs = [], []
        for i in range(20):
            x = np.full(1000 * (i % 4) + 1, i + b.rank, np.float64)
            bufs.append(x)
            works.append(b.all_reduce(x, ReduceOp.SUM))
        done_order = []
        for w in works:
            w.get_future().add_done_callback(lambda f, w=w: done_order.append(w.seq))
        for w in works:
            w.wait(timeout=60)
        for i, x in enumerate(bufs):
            assert (x == 3 * i + 3).all()
        assert [w.seq for w in works] == sorted(w.seq for w in works)
        assert all(w.is_success() for w in works)
    run_group(n, fn, transport)


def test_two_groups_async_in_opposite_order_do_not_deadlock():
    from tests.collectives.backends._socket_threads import make_backends, run_threads

    ga, gb = make_backends(2), make_backends(2)
    try:
        def fn(r):
            a, b = ga[r], gb[r]
            x, y = np.full(10, r, np.int32), np.full(10, r, np.int32)
            if r == 0:
                w1, w2 = a.all_reduce(x, ReduceOp.SUM), b.all_reduce(y, ReduceOp.SUM)
            else:
                w2, w1 = b.all_reduce(y, ReduceOp.SUM), a.all_reduce(x, ReduceOp.SUM)
            w1.wait(timeout=30)
            w2.wait(timeout=30)
            assert (x == 1).all() and (y == 1).all()
        run_threads([0, 1], fn)
    finally:
        for bk in ga + gb:
            bk.close()


def test_world_size_one():
    def fn(b):
        x = np.arange(4, dtype=np.float32)
        b.all_reduce(x, ReduceOp.AVG, blocking=True).wait()
        assert x.tolist() == [0, 1, 2, 3]
        out = [np.empty(2, np.int8)]
        b.all_gather(out, np.array([1, 2], np.int8)).wait()
        assert out[0].tolist() == [1, 2]
        o = [np.empty(3, np.int8)]
        b.all_to_all(o, [np.array([4, 5, 6], np.int8)]).wait()
        assert o[0].tolist() == [4, 5, 6]
        b.barrier().wait()
        b.send(np.array([9.0]), 0, tag=1).wait()
        y = np.empty(1)
        w = b.recv(y, None, tag=1)
        assert w.result() == [0] and y[0] == 9.0
    run_group(1, fn)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("n", SIZES)
def test_every_op_in_one_body(transport, n):
    from tests.collectives.backends._socket_bodies import all_ops

    run_group(n, lambda b: all_ops(b, 5), transport)


@pytest.fixture
def cma_reads(monkeypatch):
    """The sizes of the reads of peers' memory (process_vm_readv), in order; skips where
    there is none."""
    from ndist.collectives.backends.socket.wire import _cma

    if not _cma.available():
        pytest.skip("process_vm_readv is not available here")
    reads = []
    real = _cma.read_into

    def counting(pid, addr, dest):
        reads.append(dest.nbytes)
        real(pid, addr, dest)
    monkeypatch.setattr(_cma, "read_into", counting)
    return reads


@pytest.fixture
def many_cores(monkeypatch):
    """Pretend every rank has a core (pipelined algorithms are used on one host)."""
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 64)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("n", [2, 3])
def test_pipelined_rs_ag_in_many_chunks(transport, n, many_cores, monkeypatch):
    from ndist.collectives.backends.socket import _backend

    monkeypatch.setattr(_backend, "CHUNK", 64 << 10)
    count = 300_001

    def fn(b):
        x = np.random.default_rng(b.rank).standard_normal(count).astype(np.float64)
        b.all_reduce(x, ReduceOp.SUM, blocking=True).wait()
        assert b._links.pipeline and b._links.chunk == 64 << 10
        return x
    out = run_group(n, fn, transport)
    ref = sum(np.random.default_rng(r).standard_normal(count) for r in range(n))
    assert all(np.array_equal(o, out[0]) for o in out)
    np.testing.assert_allclose(out[0], ref, rtol=1e-12)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_all_to_all_large_messages_in_pieces(transport, many_cores):
    from ndist.collectives.backends.socket.engine._algorithms import A2A_CHUNK

    n = 3
    big = 2 * A2A_CHUNK + 3  # three pieces, uneven

    def size(i, j):  # bytes rank i sends to rank j
        return (big, 1, 0, A2A_CHUNK)[(i + 2 * j) % 4]

    def fn(b):
        r = b.rank
        ins = [(np.arange(size(r, j), dtype=np.int64) % 251 + r * 7 + j).astype(np.uint8) for j in range(n)]
        outs = [np.empty(size(i, r), np.uint8) for i in range(n)]
        b.all_to_all(outs, ins, blocking=True).wait()
        for i in range(n):
            exp = (np.arange(size(i, r), dtype=np.int64) % 251 + i * 7 + r).astype(np.uint8)
            assert np.array_equal(outs[i], exp), i
    run_group(n, fn, transport)


def test_all_to_all_large_messages_read_from_the_senders_memory(cma_reads):
    """auto transport: messages >= CMA_MIN are read by the receiver straight from the
    sender's input (process_vm_readv), smaller ones go through shm or inline."""
    from ndist.collectives.backends.socket.engine._algorithms import CMA_MIN

    reads = cma_reads
    n = 3

    def size(i, j):  # bytes rank i sends to rank j
        return (CMA_MIN + 5, 3, 0, 40 << 10)[(i + 2 * j) % 4]

    def fn(b):
        r = b.rank
        for it in range(2):  # the second round reuses the same buffers: "done" frames were waited for
            ins = [(np.arange(size(r, j), dtype=np.int64) % 251 + r * 7 + j + it).astype(np.uint8)
                   for j in range(n)]
            outs = [np.empty(size(i, r), np.uint8) for i in range(n)]
            b.all_to_all(outs, ins, blocking=True).wait()
            for i in range(n):
                exp = (np.arange(size(i, r), dtype=np.int64) % 251 + i * 7 + r + it).astype(np.uint8)
                assert np.array_equal(outs[i], exp), (i, it)
        assert b._links.cma_to == set(range(n)) - {r} and set(b._links.cma_from) == set(range(n)) - {r}
    run_group(n, fn, "auto", engine="python")  # the Python engine's CMA path
    big = sum(1 for i in range(n) for j in range(n) if i != j and size(i, j) >= CMA_MIN)
    probes = [x for x in reads if x == 16]  # each rank probed each peer once
    assert len(probes) == n * (n - 1)
    assert sorted(x for x in reads if x != 16) == [CMA_MIN + 5] * (2 * big)


def test_a_peer_is_probed_once_when_dialer_and_acceptor_ask_at_once(monkeypatch):
    """A pair whose ranks dial each other at once asks ``_can_read`` from the dialing
    thread and the acceptor thread together: one probe, one answer for both."""
    import threading
    import time
    from types import SimpleNamespace

    from ndist.collectives.backends.socket.wire import _cma, _link_facts

    if not _cma.available():
        pytest.skip("process_vm_readv is not available here")
    calls = []
    real = _cma.can_read

    def slow(pid, info):  # widens the window between the look-up and the store
        calls.append(pid)
        time.sleep(0.05)
        return real(pid, info)
    monkeypatch.setattr(_cma, "can_read", slow)
    mesh = SimpleNamespace(_reads={}, _reads_lock=threading.Lock())
    got, info, go = [], _cma.probe_info(), threading.Barrier(2)

    def ask():
        go.wait()
        got.append(_link_facts._can_read(mesh, 1, os.getpid(), info))
    threads = [threading.Thread(target=ask) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert got == [True, True] and calls == [os.getpid()]


def test_transport_shm_does_not_read_peer_memory():
    def fn(b):
        ins = [np.full(1 << 20, b.rank, np.uint8) for _ in range(2)]
        outs = [np.empty(1 << 20, np.uint8) for _ in range(2)]
        b.all_to_all(outs, ins, blocking=True).wait()
        assert (outs[0] == 0).all() and (outs[1] == 1).all()
        return (b._links.cma_to, dict(b._links.cma_from))
    assert run_group(2, fn, "shm") == [(set(), {})] * 2


@pytest.mark.parametrize("n", [2, 3, 4])
def test_large_all_reduce_reads_slices_from_peer_memory(n, many_cores, cma_reads, monkeypatch):
    """auto transport: rs+ag reads peers' slices straight from their buffers, in
    several pipelined chunks; ranks >= 2 reduce into scratch (rank order kept)."""
    from ndist.collectives.backends.socket import _backend

    monkeypatch.setattr(_backend, "CHUNK", 256 << 10)
    reads = cma_reads
    count = 300_001

    def fn(b):
        outs = []
        for it in range(2):
            x = np.random.default_rng(b.rank + 10 * it).standard_normal(count).astype(np.float32)
            b.all_reduce(x, ReduceOp.SUM, blocking=True).wait()
            outs.append(x)
        return outs
    out = run_group(n, fn, "auto", engine="python")  # the Python engine's CMA path
    for it in range(2):
        ref = np.random.default_rng(10 * it).standard_normal(count).astype(np.float32)
        for r in range(1, n):
            ref = ref + np.random.default_rng(r + 10 * it).standard_normal(count).astype(np.float32)
        for r in range(n):
            assert np.array_equal(out[r][it], ref), (r, it)
    chunks = -(-count // ((256 << 10) // 4))
    # per op, chunk and ordered pair: one read in reduce-scatter, one in all-gather
    assert len([x for x in reads if x != 16]) == 2 * 2 * chunks * n * (n - 1)


def test_failed_memory_read_fails_the_op_and_the_group_recovers(monkeypatch):
    """A read of a peer's buffer that fails (e.g. the sender failed and freed it) fails
    that op on both ranks, naming the peer; the streams stay usable."""
    import errno
    import threading

    from ndist.collectives.backends.socket.wire import _cma
    from ndist.collectives.backends.socket.engine._algorithms import CMA_MIN
    from ndist.runtime import DistBackendError

    if not _cma.available():
        pytest.skip("process_vm_readv is not available here")
    real = _cma.read_into
    lock = threading.Lock()
    left = [1]

    def failing_once(pid, addr, dest):
        with lock:
            fail = dest.nbytes >= CMA_MIN and left[0] > 0
            left[0] -= fail
        if fail:
            raise OSError(errno.EFAULT, "Bad address")
        real(pid, addr, dest)
    monkeypatch.setattr(_cma, "read_into", failing_once)

    def fn(b):
        ins = [np.full(CMA_MIN, b.rank, np.uint8) for _ in range(2)]
        outs = [np.empty(CMA_MIN, np.uint8) for _ in range(2)]
        with pytest.raises(DistBackendError, match="rank [01]"):
            b.all_to_all(outs, ins, blocking=True).wait(timeout=30)
        b.barrier(blocking=True).wait(timeout=30)
        b.all_to_all(outs, ins, blocking=True).wait(timeout=30)
        assert (outs[0] == 0).all() and (outs[1] == 1).all()
    run_group(2, fn, "auto", engine="python")  # the Python engine's CMA path
