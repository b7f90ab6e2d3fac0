"""Rank bodies shared by the thread tests and the multi-process tests."""

from __future__ import annotations

import signal
import time
from datetime import timedelta

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
        gather_scatter(b, src, count)
    outs = [np.empty(count + i, np.float64) for i in range(n)]
    b.all_gather(outs, np.full(count + r, r, np.float64), blocking=True).wait()
    assert all((outs[i] == i).all() for i in range(n))
    uneven_exchanges(b, count, np.int64, 10)
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


def gather_scatter(b, root, count, base=0):
    """gather to ``root`` (rank i gives count+i int16 of value i), then scatter from it (count+i
    uint8 of value ``base * root + i`` to rank i); asserts on this rank."""
    n, r = b.size, b.rank
    outs = [np.empty(count + i, np.int16) for i in range(n)] if r == root else None
    b.gather(outs, np.full(count + r, r, np.int16), root, blocking=True).wait()
    if r == root:
        assert all((outs[i] == i).all() for i in range(n))
    ins = [np.full(count + i, base * root + i, np.uint8) for i in range(n)] if r == root else None
    out = np.empty(count + r, np.uint8)
    b.scatter(out, ins, root, blocking=True).wait()
    assert (out == base * root + r).all()


def uneven_exchanges(b, count, dtype, scale):
    """all_to_all where rank i sends (i + j) % 3 * count elements of ``dtype`` (value
    ``scale * i + j``) to rank j, zero sizes included, then reduce_scatter with uneven blocks
    (count+i int64 to rank i); asserts on this rank."""
    n, r = b.size, b.rank
    ins = [np.full((r + j) % 3 * count, scale * r + j, dtype) for j in range(n)]
    outs = [np.empty((i + r) % 3 * count, dtype) for i in range(n)]
    b.all_to_all(outs, ins, blocking=True).wait()
    assert all((outs[i] == scale * i + r).all() for i in range(n))
    ins = [np.full(count + j, r + 1, np.int64) for j in range(n)]
    out = np.empty(count + r, np.int64)
    b.reduce_scatter(out, ins, ReduceOp.SUM, blocking=True).wait()
    assert (out == n * (n + 1) // 2).all()


def broadcast_to_a_dead_receiver(rank, n, folder, count, late=0.0):
    """Rank 2 of 3 SIGKILLs itself (``tests.kill_sync``) after a first broadcast of ``count``
    float32 from rank 0 and a barrier, and never joins the next broadcasts; rank 1 calls them
    ``late`` seconds after. Run by ``run_with_victim(..., victim=2)``: rank 0 returns what it
    got, ``first`` / ``next``: the error (type, message, rank) of the root's next broadcast or
    of the one after (``"no error"``), ``first_s`` / ``next_s``: how long each took."""
    import ndist.distributed as dist
    from tests.kill_sync import all_past, kill_self

    signal.signal(signal.SIGTERM, lambda *a: None)  # stay to report (till the launcher's term-timeout)
    dist.init_process_group("socket", timeout=timedelta(seconds=20))
    x = np.ones(count, np.float32)
    dist.broadcast(x, src=0)
    dist.barrier()
    all_past(folder, rank, n, victim=2)
    if rank == 2:
        kill_self(folder)  # never joins the next broadcast
    if rank == 1:
        time.sleep(late)
    rec = {"first": None, "next": None}
    t0 = time.monotonic()
    try:
        dist.broadcast(x, src=0)
        rec["first_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        dist.broadcast(x, src=0)
        rec["next"] = "no error"
    except dist.DistError as err:
        rec["next" if "first_s" in rec else "first"] = [type(err).__name__, str(err), err.rank]
    rec["next_s"] = time.monotonic() - t0
    return rec


def op_buffers(rank, size, k, base):
    """Buffers for each single-buffer op on this rank: ``full`` (k * size float32,
    ``arange + base * rank``), ``out`` (its size), ``part`` (k of ``rank``), ``part_out`` (k);
    for an uneven all_to_all_single, the split sizes ``ins`` (rank + 1 + q to rank q) and
    ``outs`` (q + 1 + rank from rank q) and their buffers ``uin`` and ``uout``."""
    n = k * size
    full = np.arange(n, dtype=np.float32) + base * rank
    out, part, part_out = np.empty(n, np.float32), np.full(k, rank, np.float32), np.empty(k, np.float32)
    ins = [rank + 1 + q for q in range(size)]
    outs = [q + 1 + rank for q in range(size)]
    uin, uout = np.full(sum(ins), rank, np.float32), np.empty(sum(outs), np.float32)
    return full, out, part, part_out, ins, outs, uin, uout


def record_schedules() -> list:
    """The algorithm of every schedule this rank runs from now on, appended to the list
    returned (instrumentation only: the real executor still runs)."""
    from ndist.collectives.backends.socket.engine import _scheduled

    seen = []
    run = _scheduled.Scheduled.run

    def recorded(self, sch, *args, **kwargs):
        seen.append(sch.algo)
        return run(self, sch, *args, **kwargs)

    _scheduled.Scheduled.run = recorded
    return seen
