"""The socket backend's schedules, run for up to 1,024 ranks in one process.

Each test builds every rank's real schedule (``_schedule.schedule``), plays them
over the simulated links of ``_simulate.simulate`` (no sockets, no processes),
compares the result with a NumPy oracle and checks each rank's rounds, messages
and bytes against the textbook bounds. A test of counts, not of time.
"""

from __future__ import annotations

import numpy as np
import pytest

from ndist.collectives import ReduceOp
from ndist.collectives.backends.socket.schedules import _schedule as S
from ndist.collectives.backends.socket.schedules._simulate import ScheduleError, simulate

NS = (1, 2, 3, 4, 5, 7, 8, 16, 31, 64, 1024)
POW2 = tuple(n for n in NS if n & (n - 1) == 0)


def log2c(n: int) -> int:
    return (n - 1).bit_length()


def u8(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


def scheds(op, algo, item, sizes, n, root=0, per_rank=None):
    return [S.schedule(op, algo, item, per_rank(r) if per_rank else sizes, n, r, root) for r in range(n)]


# ------------------------------------------------------------------ all_reduce
def _all_reduce(n, algo, count, dtype=np.float32, op=ReduceOp.SUM, seed=0):
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((n, count)).astype(dtype) if np.dtype(dtype).kind == "f" else \
        rng.integers(-1000, 1000, (n, count)).astype(dtype)
    bufs = [{S.BUF: u8(data[r].copy())} for r in range(n)]
    st = simulate(scheds("all_reduce", algo, data.itemsize, (count,), n), bufs, dtype, op)
    out = np.stack([b[S.BUF].view(dtype) for b in bufs])
    return data, out, st


@pytest.mark.parametrize("n", NS)
def test_recursive_doubling_all_reduce(n):
    count = 5
    data, out, st = _all_reduce(n, "recursive_doubling", count)
    # bit-identical on every rank, and the sum
    assert (out.view(np.uint32) == out[0].view(np.uint32)).all()
    np.testing.assert_allclose(out[0], data.astype(np.float64).sum(0), rtol=1e-4, atol=1e-3)
    B = count * 4
    p = 1 << (n.bit_length() - 1)
    fold = 2 if n != p else 0
    assert st.depth == p.bit_length() - 1 + fold <= log2c(n) + fold
    assert st.rounds.max() <= log2c(n) + fold
    assert st.bytes_sent.max() <= B * (p.bit_length() - 1 + 1)
    assert st.msgs_sent.max() <= log2c(n) + 1
    idata, iout, _ = _all_reduce(n, "recursive_doubling", 3, np.int64)
    assert (iout == idata.sum(0)).all()
    _, _, _ = _all_reduce(n, "recursive_doubling", 0)  # empty buffers move headers only


@pytest.mark.parametrize("algo,n", [("rabenseifner", n) for n in POW2] +
                         [("ring", n) for n in NS if n <= 64])
def test_reduce_scatter_all_gather_all_reduce(algo, n):
    count = 3 * n  # divisible: the bytes bound is exact
    data, out, st = _all_reduce(n, algo, count, seed=n)
    assert (out.view(np.uint32) == out[0].view(np.uint32)).all()
    np.testing.assert_allclose(out[0], data.astype(np.float64).sum(0), rtol=1e-4, atol=1e-3)
    B = count * 4
    assert (st.bytes_sent <= 2 * B * (n - 1) // n).all()
    assert (st.bytes_recv <= 2 * B * (n - 1) // n).all()
    want = 2 * log2c(n) if algo == "rabenseifner" else 2 * (n - 1)
    assert st.depth == want and st.rounds.max() == want
    # uneven blocks and integers: exact
    idata, iout, _ = _all_reduce(n, algo, count + 1, np.int32, ReduceOp.MAX)
    assert (iout == idata.max(0)).all()


@pytest.mark.parametrize("n", (5, 8, 64))
@pytest.mark.parametrize("op", [ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.BXOR])
def test_all_reduce_ops(n, op):
    for algo in ("recursive_doubling", "ring") + (("rabenseifner",) if n & (n - 1) == 0 else ()):
        data, out, _ = _all_reduce(n, algo, 2 * n + 1, np.int64, op)
        want = {ReduceOp.PRODUCT: lambda a: np.prod(a, 0), ReduceOp.MIN: lambda a: a.min(0),
                ReduceOp.BXOR: lambda a: np.bitwise_xor.reduce(a, 0)}[op](data)
        assert (out == want).all(), algo


# ------------------------------------------------------------------ reduce_scatter
@pytest.mark.parametrize("n", NS)
def test_reduce_scatter(n):
    sizes = tuple(j % 3 + 1 for j in range(n))
    ins = np.random.default_rng(n).integers(-50, 50, (n, sum(sizes)))  # rank q's inputs, concatenated
    bufs = [{S.INS: u8(ins[r].copy()), S.BUF: np.zeros(sizes[r] * 8, np.uint8)} for r in range(n)]
    algo = "ring" if n & (n - 1) else "recursive_halving"
    st = simulate(scheds("reduce_scatter", algo, 8, sizes, n), bufs, np.int64, ReduceOp.SUM)
    want, bb = ins.sum(0), np.cumsum((0,) + sizes)
    for r in range(n):
        assert (bufs[r][S.BUF].view(np.int64) == want[bb[r]:bb[r + 1]]).all()
    total = sum(sizes) * 8
    assert (st.bytes_sent <= total).all()
    assert st.depth == (log2c(n) if algo == "recursive_halving" else n - 1)


# ------------------------------------------------------------------ all_gather
@pytest.mark.parametrize("n", NS)
def test_bruck_all_gather(n):
    for sizes in (tuple(j % 3 for j in range(n)), (2,) * n):
        rng = np.random.default_rng(n)
        ins = [rng.integers(0, 1 << 30, sizes[r]).astype(np.int32) for r in range(n)]
        total = sum(sizes) * 4
        bufs = [{S.INP: u8(ins[r]), S.OUTS: np.zeros(total, np.uint8)} for r in range(n)]
        st = simulate(scheds("all_gather", "bruck", 4, sizes, n), bufs)
        want = u8(np.concatenate(ins))
        for r in range(n):
            assert (bufs[r][S.OUTS] == want).all()
        assert st.depth == log2c(n) and st.rounds.max() == log2c(n)
        assert (st.msgs_sent <= log2c(n)).all()
        if len(set(sizes)) == 1:
            assert (st.bytes_sent == (n - 1) * sizes[0] * 4).all()


# ------------------------------------------------------------------ rooted
@pytest.mark.parametrize("n", NS)
def test_binomial_broadcast(n):
    for root in {0, n - 1, n // 2}:
        data = np.arange(7, dtype=np.int16) * (root + 1)
        bufs = [{S.BUF: u8(data.copy() if r == root else np.zeros(7, np.int16))} for r in range(n)]
        st = simulate(scheds("broadcast", "binomial", 2, (7,), n, root), bufs)
        for r in range(n):
            assert (bufs[r][S.BUF].view(np.int16) == data).all()
        assert st.depth == log2c(n) and st.rounds.max() <= log2c(n)
        assert (st.bytes_recv[np.arange(n) != root] == 14).all()
        assert st.msgs_sent[root] == log2c(n)
        assert st.bytes_sent.sum() == 14 * (n - 1)


@pytest.mark.parametrize("n", NS)
def test_binomial_reduce(n):
    for root in {0, n - 1, n // 3}:
        rng = np.random.default_rng(root)
        data = rng.integers(-9, 9, (n, 4)).astype(np.int64)
        bufs = [{S.BUF: u8(data[r].copy())} for r in range(n)]
        st = simulate(scheds("reduce", "binomial", 8, (4,), n, root), bufs, np.int64, ReduceOp.SUM)
        for r in range(n):
            got = bufs[r][S.BUF].view(np.int64)
            assert (got == (data.sum(0) if r == root else data[r])).all(), r  # others' BUF untouched
        assert st.depth == log2c(n) and st.rounds.max() <= log2c(n)
        assert st.bytes_sent.sum() == 32 * (n - 1)
        assert st.msgs_recv[root] == log2c(n)


def _sized(op, n, root, counts):
    """The two phases of gather / scatter: the counts (8 bytes each) along the tree,
    then the data with the sizes each rank learnt. Returns (data buffers, stats)."""
    one = (1,) * n
    pb = []
    for r in range(n):
        b = {S.BUF: np.zeros(8, np.uint8), S.INP: u8(np.array([counts[r]], np.uint64))}
        if r == root:
            b[S.OUTS] = np.zeros(8 * n, np.uint8)
            b[S.INS] = u8(np.array(counts, np.uint64))
        pb.append(b)
    st1 = simulate(scheds(op, "binomial", 8, one, n, root), pb)
    known = []
    for r in range(n):
        ranks = S.subtree(n, r, root)
        got = pb[r][S.TMP].view(np.uint64) if pb[r][S.TMP].nbytes else \
            (pb[r][S.INP] if op == "gather" else pb[r][S.BUF]).view(np.uint64)
        k = [0] * n
        for q, c in zip(ranks, got):
            k[q] = int(c)
        if r == root:
            k = list(counts)
        assert all(k[q] == counts[q] for q in ranks), (r, k)
        known.append(tuple(k))
    return known, st1


@pytest.mark.parametrize("n", NS)
def test_binomial_gather(n):
    for root in {0, n - 1}:
        counts = tuple(r % 3 + 1 for r in range(n))
        known, st1 = _sized("gather", n, root, counts)
        ins = [np.full(counts[r], r, np.int32) for r in range(n)]
        bufs = [{S.INP: u8(ins[r]), S.BUF: np.zeros(0, np.uint8)} for r in range(n)]
        bufs[root][S.OUTS] = np.zeros(sum(counts) * 4, np.uint8)
        st = simulate([S.schedule("gather", "binomial", 4, known[r], n, r, root) for r in range(n)], bufs)
        assert (bufs[root][S.OUTS].view(np.int32) == np.concatenate(ins)).all()
        assert st.depth == st1.depth == log2c(n)
        assert st.msgs_recv[root] == log2c(n)
        assert st.bytes_recv[root] == 4 * (sum(counts) - counts[root])


@pytest.mark.parametrize("n", NS)
def test_binomial_scatter(n):
    for root in {0, n // 2}:
        counts = tuple((r * 5) % 4 + 1 for r in range(n))
        known, st1 = _sized("scatter", n, root, counts)
        ins = [np.full(counts[r], r + 100, np.int16) for r in range(n)]
        bufs = [{S.BUF: np.zeros(counts[r] * 2, np.uint8)} for r in range(n)]
        bufs[root][S.INS] = u8(np.concatenate(ins))
        st = simulate([S.schedule("scatter", "binomial", 2, known[r], n, r, root) for r in range(n)], bufs)
        for r in range(n):
            assert (bufs[r][S.BUF].view(np.int16) == ins[r]).all()
        assert st.depth == st1.depth == log2c(n)
        assert st.msgs_sent[root] == log2c(n)
        assert st.bytes_sent[root] == 2 * (sum(counts) - counts[root])


# ------------------------------------------------------------------ barrier, all_to_all
@pytest.mark.parametrize("n", NS)
def test_dissemination_barrier(n):
    st = simulate(scheds("barrier", "dissemination", 1, (), n), [{S.BUF: np.zeros(0, np.uint8)} for _ in range(n)])
    assert st.depth == log2c(n) and (st.rounds == log2c(n)).all()
    assert (st.bytes_sent == 0).all()
    everyone = (1 << n) - 1
    assert all(h == everyone for h in st.heard)  # each rank heard of every arrival


@pytest.mark.parametrize("n", [*NS[:-1], 256])
def test_pairwise_all_to_all(n):
    """n - 1 rounds of one message each way: n^2 messages in all. Up to 256 ranks (65,536
    messages, 2 s): at 1,024 a million messages took 30 s alone and 140 s beside another
    test in CI, the largest share of its time, and the schedule's arithmetic (peer
    ``(r +- t) mod n``) has nothing that differs at 1,024."""
    isz = lambda r: tuple((r + j) % 3 for j in range(n))  # noqa: E731
    osz = lambda r: tuple((i + r) % 3 for i in range(n))  # noqa: E731
    bufs = []
    for r in range(n):
        b = {S.IN + j: u8(np.full(c, r * 4096 + j, np.int32)) for j, c in enumerate(isz(r))}
        b.update({S.OUT + j: np.zeros(c * 4, np.uint8) for j, c in enumerate(osz(r))})
        bufs.append(b)
    st = simulate(scheds("all_to_all", "pairwise", 4, None, n, per_rank=lambda r: (isz(r), osz(r))), bufs)
    for r in (0, n // 2, n - 1):
        for i in range(n):
            assert (bufs[r][S.OUT + i].view(np.int32) == i * 4096 + r).all()
    assert st.depth == n - 1 and (st.rounds <= n - 1).all()
    assert (st.msgs_sent == n - 1).all()


@pytest.mark.parametrize("n", [*NS[:-1], 256])
def test_bruck_all_to_all(n):
    """Even blocks: ceil(log2 n) rounds of one message each way; each rank sends the
    c_k blocks with bit k set, sum_k c_k <= (n // 2) ceil(log2 n) blocks (exactly
    (n / 2) log2 n on a power of two), where pairwise sends n - 1 messages. n^2
    blocks and about 3n copies per rank: up to 256 ranks (1,024 took 21 s in CI, the
    seventh slowest test, and its rounds are 256's with two more bits)."""
    for count in (3, 0) if n <= 64 else (3,):  # (0: every message a header-only ticket)
        ins = np.arange(n)[:, None, None] * 4096 + np.arange(n)[None, :, None] * 8 + np.arange(count, dtype=np.int32)
        ins = ins.astype(np.int32)  # ins[r, j]: rank r's block for j
        outs = np.full((n, n, count), -1, np.int32)
        bufs = []
        for r in range(n):
            b = {S.INS: u8(ins[r])}
            b.update({S.OUT + j: u8(outs[r, j]) for j in range(n)})
            bufs.append(b)
        sizes = ((count,) * n, (count,) * n)
        st = simulate(scheds("all_to_all", "bruck", 4, sizes, n), bufs)
        assert (outs == ins.transpose(1, 0, 2)).all()  # rank r's block from i is rank i's for r
        assert st.depth == log2c(n) and (st.rounds == log2c(n)).all()
        assert (st.msgs_sent == log2c(n)).all() and (st.msgs_recv == log2c(n)).all()
        blocks = sum(sum(1 for j in range(n) if j & (1 << t)) for t in range(log2c(n)))
        assert blocks <= n // 2 * log2c(n)
        if n & (n - 1) == 0:
            assert blocks == n // 2 * log2c(n)
        assert (st.bytes_sent == blocks * count * 4).all() and (st.bytes_recv == blocks * count * 4).all()


def test_bruck_all_to_all_needs_even_blocks():
    with pytest.raises(ValueError, match="bruck: expected the same count"):
        S.schedule("all_to_all", "bruck", 4, ((1, 2, 1), (1, 2, 1)), 3, 0)


# ------------------------------------------------------------------ the checks themselves
def test_simulator_rejects_mismatched_schedules():
    a = S.Schedule("x", (S.Round((S.Send(1, S.BUF, 0, 4),), ()),))
    b = S.Schedule("x", (S.Round((), (S.Recv(0, S.BUF, 0, 8),)),))
    with pytest.raises(ScheduleError, match="expects 8 bytes from 0"):
        simulate([a, b], [{S.BUF: np.zeros(8, np.uint8)} for _ in range(2)])
    c = S.Schedule("x", (S.Round((S.Send(1, S.BUF, 0, 4),), (S.Recv(1, S.BUF, 2, 4),)),))
    with pytest.raises(ScheduleError, match="overlaps a send"):
        simulate([c, c._replace(rounds=(S.Round((S.Send(0, S.BUF, 0, 4),), (S.Recv(0, S.BUF, 4, 4),)),))],
                 [{S.BUF: np.zeros(8, np.uint8)} for _ in range(2)])
    lost = S.Schedule("x", (S.Round((S.Send(1, S.BUF, 0, 4),), ()),))
    with pytest.raises(ScheduleError, match="never received"):
        simulate([lost, S.Schedule("x", ())], [{S.BUF: np.zeros(8, np.uint8)} for _ in range(2)])


def test_choose_is_direct_up_to_four_ranks_and_forced_by_name():
    assert S.choose("all_reduce", 4096, 4) is None
    assert S.choose("all_reduce", 4096, 5) == "recursive_doubling"
    assert S.choose("all_reduce", 1 << 20, 8, 1 << 18) == "rabenseifner"
    assert S.choose("all_reduce", 1 << 20, 6, 1 << 18) == "ring"
    assert S.choose("all_reduce", 4096, 8, force="direct") is None
    assert S.choose("broadcast", 4096, 2, force="sched") == "binomial"
    assert S.choose("all_to_all", 4096, 8) == "pairwise"  # a rank cannot know the others are even


def test_choose_bruck_all_to_all_for_small_even_blocks():
    """Only the even form (every rank's blocks one size, which all know) runs Bruck:
    3 rounds at 8 ranks where pairwise takes 7; large blocks stay pairwise."""
    small = S.choose("all_to_all", 1024, 8, even=True)
    assert small == "bruck"
    assert len(S.schedule("all_to_all", small, 1, ((1024,) * 8,) * 2, 8, 0).rounds) == 3
    assert S.choose("all_to_all", 1024, 5, even=True) == "bruck"
    assert S.choose("all_to_all", S.A2A_BRUCK_MAX, 8, even=True) == "bruck"
    assert S.choose("all_to_all", S.A2A_BRUCK_MAX + 1, 8, even=True) == "pairwise"
    assert S.choose("all_to_all", 1024, 3, even=True) is None  # direct up to four ranks
    assert S.choose("all_to_all", 1024, 3, force="sched", even=True) == "bruck"


def test_schedules_are_cached():
    a = S.schedule("all_reduce", "recursive_doubling", 4, (10,), 8, 3)
    assert S.schedule("all_reduce", "recursive_doubling", 4, (10,), 8, 3) is a
