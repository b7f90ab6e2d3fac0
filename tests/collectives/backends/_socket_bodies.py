"""Rank bodies shared by the thread tests and the multi-process tests."""

from __future__ import annotations

import numpy as np

from ndist.collectives import ReduceOp


def all_ops(b, count=3):
    """Every collective once, uneven sizes, every root; asserts on this rank."""
    n, r = b.size, b.rank
    x = np.arange(count, dtype=np.float32) * (r + 1)
    b.all_reduce(x, ReduceOp.SUM, blocking=True).wait()
    assert np.array_equal(x, np.arange(count, dtype=np.float32) * (n * (n + 1) // 2))
    big = np.full(300_001, r + 1, np.float64)  # reduce-scatter + all-gather path
    b.all_reduce(big, ReduceOp.MAX, blocking=True).wait()
    assert (big == n).all()
    for src in range(n):
        y = np.full(count, r, np.int64)
        b.broadcast(y, src, blocking=True).wait()
        assert (y == src).all()
        z = np.full(count, r + 1, np.int32)
        b.reduce(z, src, ReduceOp.PRODUCT, blocking=True).wait()
        import math
        assert (z == (math.factorial(n) if r == src else r + 1)).all()
        outs = [np.empty(count + i, np.int16) for i in range(n)] if r == src else None
        b.gather(outs, np.full(count + r, r, np.int16), src, blocking=True).wait()
        if r == src:
            assert all((outs[i] == i).all() for i in range(n))
        ins = [np.full(count + i, i, np.uint8) for i in range(n)] if r == src else None
        o = np.empty(count + r, np.uint8)
        b.scatter(o, ins, src, blocking=True).wait()
        assert (o == r).all()
    outs = [np.empty(count + i, np.float64) for i in range(n)]
    b.all_gather(outs, np.full(count + r, r, np.float64), blocking=True).wait()
    assert all((outs[i] == i).all() for i in range(n))
    ins = [np.full((r + j) % 3 * count, 10 * r + j, np.int64) for j in range(n)]
    outs = [np.empty((i + r) % 3 * count, np.int64) for i in range(n)]
    b.all_to_all(outs, ins, blocking=True).wait()
    assert all((outs[i] == 10 * i + r).all() for i in range(n))
    ins = [np.full(count + j, r + 1, np.int64) for j in range(n)]
    out = np.empty(count + r, np.int64)
    b.reduce_scatter(out, ins, ReduceOp.SUM, blocking=True).wait()
    assert (out == n * (n + 1) // 2).all()
    # p2p ring, isend/irecv in opposite orders on even and odd ranks
    nxt, prv = (r + 1) % n, (r - 1) % n
    got = np.empty(count, np.int32)
    if r % 2:
        ws = [b.recv(got, prv, tag=9), b.send(np.full(count, r, np.int32), nxt, tag=9)]
    else:
        ws = [b.send(np.full(count, r, np.int32), nxt, tag=9), b.recv(got, prv, tag=9)]
    for w in ws:
        w.wait(timeout=60)
    assert (got == prv).all() and ws[0 if r % 2 else 1].result() == [prv]
    b.barrier(blocking=True).wait()
    return True
