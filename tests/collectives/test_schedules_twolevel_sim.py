"""Two-level schedules (a group spanning hosts), run in one process by the simulator.

Every rank is given a host; the real schedules (``_schedule.schedule`` with
``two_level``) run over simulated links against a NumPy oracle, and the
simulator counts what crosses hosts: only the leaders send or receive across,
in ceil(log2 H) rounds for small messages (a non-power of two included).
"""

from __future__ import annotations

import numpy as np
import pytest

from ndist.collectives import ReduceOp
from ndist.collectives.backends.socket.schedules import _schedule as S
from ndist.collectives.backends.socket.schedules._simulate import simulate
from ndist.collectives.backends.socket.wire._links import topology


def blocks(*per_host):
    """Ranks placed host by host: blocks(3, 1, 4) -> (0, 0, 0, 1, 2, 2, 2, 2)."""
    return tuple(h for h, k in enumerate(per_host) for _ in range(k))


TOPOS = {
    "3x2": blocks(2, 2, 2),
    "2x3": blocks(3, 3),
    "4x8": blocks(*[8] * 4),
    "uneven-3-1-4": blocks(3, 1, 4),
    "round-robin-3x3": tuple(r % 3 for r in range(9)),
    "5x3": blocks(*[3] * 5),
    "16x64": blocks(*[64] * 16),
    "7-uneven": blocks(1, 5, 2, 9, 1, 3, 4),
}


NAMES = list(TOPOS)


def log2c(n: int) -> int:
    return (n - 1).bit_length()


def small_xrounds(h: int) -> int:
    """Rounds of recursive doubling among h leaders."""
    return log2c(h)


def u8(a):
    return a.reshape(-1).view(np.uint8)


def scheds(op, item, sizes, topo, root=0, algo=None):
    n = len(topo)
    if algo is None:
        algo = S.choose(op, 0, n, topo=topo)
        assert algo == S.TWO_LEVEL
    return [S.schedule(op, algo, item, sizes, n, r, root, topo if algo == S.TWO_LEVEL else None) for r in range(n)]


def leaders(topo):
    seen, out = set(), []
    for r, h in enumerate(topo):
        if h not in seen:
            seen.add(h)
            out.append(r)
    return out


def _only_leaders_cross(st, topo, reps=None):
    reps = set(leaders(topo) if reps is None else reps)
    for r in range(len(topo)):
        if r not in reps:
            assert st.xmsgs_sent[r] == 0 and st.xmsgs_recv[r] == 0, r


def _all_reduce(topo, count, dtype=np.float32, op=ReduceOp.SUM, algo=None, seed=0):
    n = len(topo)
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((n, count)).astype(dtype) if np.dtype(dtype).kind == "f" else \
        rng.integers(-1000, 1000, (n, count)).astype(dtype)
    bufs = [{S.BUF: u8(data[r].copy())} for r in range(n)]
    item = np.dtype(dtype).itemsize
    algo = algo or S.choose("all_reduce", count * item, n, count, topo=topo)
    st = simulate(scheds("all_reduce", item, (count,), topo, algo=algo), bufs, dtype, op, hosts=topo)
    return data, np.stack([b[S.BUF].view(dtype) for b in bufs]), st


@pytest.mark.parametrize("name", NAMES)
def test_two_level_all_reduce_small(name):
    topo = TOPOS[name]
    nh = max(topo) + 1
    count = 5
    data, out, st = _all_reduce(topo, count)
    assert S.schedule("all_reduce", S.TWO_LEVEL, 4, (count,), len(topo), 0, 0, topo).algo == \
        "two_level/recursive_doubling"
    assert (out.view(np.uint32) == out[0].view(np.uint32)).all()  # bit-identical on every rank
    np.testing.assert_allclose(out[0], data.astype(np.float64).sum(0), rtol=1e-4, atol=1e-3)
    _only_leaders_cross(st, topo)
    assert st.xrounds == small_xrounds(nh)
    B = count * 4
    for r in leaders(topo):
        assert st.xrounds_rank[r] <= small_xrounds(nh)
        assert st.xbytes_sent[r] <= B * (small_xrounds(nh) + 1)
    # integers: exact; other ops
    idata, iout, _ = _all_reduce(topo, 3, np.int64)
    assert (iout == idata.sum(0)).all()
    idata, iout, _ = _all_reduce(topo, 4, np.int32, ReduceOp.MAX)
    assert (iout == idata.max(0)).all()
    _all_reduce(topo, 0)  # empty buffers: headers only


@pytest.mark.parametrize("name", ["3x2", "4x8", "uneven-3-1-4", "round-robin-3x3", "5x3"])
def test_two_level_all_reduce_large(name):
    topo = TOPOS[name]
    nh = max(topo) + 1
    count = 70_003  # > 256 KiB of float32: the leaders run a reduce-scatter + all-gather
    data, out, st = _all_reduce(topo, count, seed=3)
    algo = S.schedule("all_reduce", S.TWO_LEVEL, 4, (count,), len(topo), 0, 0, topo).algo
    assert algo == ("two_level/rabenseifner" if nh & (nh - 1) == 0 else "two_level/ring")
    assert (out.view(np.uint32) == out[0].view(np.uint32)).all()
    np.testing.assert_allclose(out[0], data.astype(np.float64).sum(0), rtol=1e-4, atol=1e-3)
    _only_leaders_cross(st, topo)
    B = count * 4
    for r in leaders(topo):
        assert st.xbytes_sent[r] <= 2 * B * (nh - 1) / nh + 2 * nh * 4  # + uneven blocks


def test_two_level_reduction_order_is_the_documented_one():
    """3 hosts x 2: P_h = x_2h + x_2h+1; the leaders compute (P_0 + P_1) + P_2 (host 2,
    the extra, sends P_2 to both 0 and 1 in round 0): exactly, in float32, on every rank.
    5 hosts x 3: P_h = (x_3h + x_3h+1) + x_3h+2, then ((P_0 + P_1) + P_4) + (P_2 + P_3)."""
    topo = TOPOS["3x2"]
    data, out, _ = _all_reduce(topo, 257, seed=11)
    p = [data[2 * h] + data[2 * h + 1] for h in range(3)]
    want = (p[0] + p[1]) + p[2]
    assert (out.view(np.uint32) == want.view(np.uint32)).all()
    data, out, _ = _all_reduce(TOPOS["5x3"], 65, seed=13)
    p = [(data[3 * h] + data[3 * h + 1]) + data[3 * h + 2] for h in range(5)]
    want = ((p[0] + p[1]) + p[4]) + (p[2] + p[3])
    assert (out.view(np.uint32) == want.view(np.uint32)).all()
    data, out, _ = _all_reduce(TOPOS["4x8"], 33, seed=12)
    p = []
    for h in range(4):
        x = data[8 * h: 8 * h + 8]
        a = [x[0] + x[1], x[2] + x[3], x[4] + x[5], x[6] + x[7]]
        p.append((a[0] + a[1]) + (a[2] + a[3]))
    want = (p[0] + p[1]) + (p[2] + p[3])
    assert (out.view(np.uint32) == want.view(np.uint32)).all()


def test_flat_sends_more_across_hosts_than_two_level():
    topo = TOPOS["4x8"]
    count = 1024
    _, _, two = _all_reduce(topo, count)
    _, _, flat = _all_reduce(topo, count, algo="recursive_doubling")
    assert flat.xbytes_sent.sum() > 4 * two.xbytes_sent.sum()
    assert (flat.xmsgs_sent[[r for r in range(32) if r not in leaders(topo)]] > 0).any()


@pytest.mark.parametrize("name", NAMES)
def test_two_level_broadcast(name):
    topo = TOPOS[name]
    n, nh = len(topo), max(topo) + 1
    for root in sorted({0, n - 1, n // 2}):
        data = np.arange(11, dtype=np.int16) * (root + 1)
        bufs = [{S.BUF: u8(data.copy() if r == root else np.zeros(11, np.int16))} for r in range(n)]
        st = simulate(scheds("broadcast", 2, (11,), topo, root), bufs, hosts=topo)
        for r in range(n):
            assert (bufs[r][S.BUF].view(np.int16) == data).all(), (root, r)
        reps = [root if h == topo[root] else leaders(topo)[h] for h in range(nh)]
        _only_leaders_cross(st, topo, reps)
        assert st.xrounds == log2c(nh)
        assert st.xbytes_sent.sum() == 22 * (nh - 1)  # each other host gets the bytes once
        assert st.depth == log2c(nh) + max(log2c(topo.count(h)) for h in range(nh))


@pytest.mark.parametrize("name", NAMES)
def test_two_level_barrier(name):
    topo = TOPOS[name]
    n, nh = len(topo), max(topo) + 1
    st = simulate(scheds("barrier", 1, (), topo), [{S.BUF: np.zeros(0, np.uint8)} for _ in range(n)], hosts=topo)
    assert all(h == (1 << n) - 1 for h in st.heard)  # every rank heard of every arrival
    _only_leaders_cross(st, topo)
    assert st.xrounds == log2c(nh)
    assert (st.bytes_sent == 0).all()


@pytest.mark.parametrize("name", NAMES)
def test_two_level_all_gather(name):
    topo = TOPOS[name]
    n, nh = len(topo), max(topo) + 1
    sizes = tuple(r % 3 + (1 if r % 5 else 0) for r in range(n))
    rng = np.random.default_rng(n)
    ins = [rng.integers(0, 1 << 30, sizes[r]).astype(np.int32) for r in range(n)]
    total = sum(sizes) * 4
    bufs = [{S.INP: u8(ins[r]), S.OUTS: np.zeros(total, np.uint8)} for r in range(n)]
    st = simulate(scheds("all_gather", 4, sizes, topo), bufs, hosts=topo)
    want = u8(np.concatenate(ins))
    for r in range(n):
        assert (bufs[r][S.OUTS] == want).all(), r
    _only_leaders_cross(st, topo)
    assert st.xrounds == log2c(nh)
    for h, r in enumerate(leaders(topo)):
        mine = sum(sizes[q] for q in range(n) if topo[q] == h) * 4
        assert st.xbytes_recv[r] == total - mine  # each block crosses into a host once


def test_topology_and_choice():
    assert topology(["b", "b", "a", "c", "a"]) == (0, 0, 1, 2, 1)
    one = (0,) * 8
    for op in S.TWO_LEVEL_OPS:
        assert S.choose(op, 4096, 6, 1024, topo=TOPOS["3x2"]) == S.TWO_LEVEL
        assert S.choose(op, 4096, 4, 1024, topo=blocks(2, 2)) == S.TWO_LEVEL
        # one host: today's choice, unchanged
        assert S.choose(op, 4096, 8, 1024, topo=one) == S.choose(op, 4096, 8, 1024)
        assert S.choose(op, 4096, 4, 1024, topo=(0,) * 4) is None
        # one rank per host: two levels would be the flat algorithm
        assert S.choose(op, 4096, 8, 1024, topo=tuple(range(8))) == S.choose(op, 4096, 8, 1024)
        # forced
        assert S.choose(op, 4096, 6, 1024, force="flat", topo=TOPOS["3x2"]) == S.choose(op, 4096, 6, 1024)
        assert S.choose(op, 4096, 6, 1024, force="direct", topo=TOPOS["3x2"]) is None
    # ops without a two-level schedule keep the flat ones
    assert S.choose("all_to_all", 4096, 6, topo=TOPOS["3x2"]) == "pairwise"
    assert S.choose("reduce_scatter", 4096, 8, topo=TOPOS["4x8"][:8]) == "recursive_halving"
    with pytest.raises(ValueError, match="topo"):
        S.schedule("all_reduce", S.TWO_LEVEL, 4, (3,), 6, 0, 0, None)
