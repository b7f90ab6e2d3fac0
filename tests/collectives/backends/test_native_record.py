"""The flight recorder's ring and counters in C (``_cnative.Ring`` / ``Counter``, native/crecord.c):
what Python sees of them (a deque of entries, an ``itertools.count``), the recorder adopting them
with what it holds, and the entries the repeated call in C writes (FastLane and the C interface)
among the Python paths' on one group: issue order, fields, states, the ring wrapping, one
sequence of numbers; the same on the Python engine; size 0."""

from __future__ import annotations

import itertools
import os
import threading
import time

import numpy as np
import pytest

from ndist.collectives import Call, Op, ReduceOp
from ndist.collectives._debug import FlightRecorder
from ndist.testing import run_ranks
from tests.collectives.backends import _capi_ctypes as C

_cnative = pytest.importorskip("ndist.collectives.backends.socket.native._cnative")


def test_the_ring_and_counter_read_as_a_deque_and_a_count():
    ring = _cnative.Ring(3)
    entries = [[i] for i in range(5)]
    for e in entries:
        ring.append(e)
    assert len(ring) == 3 and ring.maxlen == 3 and ring.count == 5
    got = ring.copy()
    assert got == [[2], [3], [4]] and all(a is b for a, b in zip(got, entries[2:]))  # the entries themselves
    assert list(ring) == got
    c = _cnative.Counter(7)
    assert iter(c) is c and [next(c), next(c)] == [7, 8] and c.last == 8
    assert list(itertools.islice(_cnative.Counter(), 3)) == [1, 2, 3]
    with pytest.raises(ValueError, match=r"maxlen: expected an int in \[1, .*got 0"):
        _cnative.Ring(0)
    with pytest.raises(ValueError, match="start: expected an int >= 1, got 0"):
        _cnative.Counter(0)


def test_adopting_carries_the_entries_and_numbers_over():
    rec = FlightRecorder("g", 0, 3)
    x = np.zeros(4, np.float32)
    call = Call(Op.ALL_REDUCE, "cpu", x.dtype, out=x, redop=ReduceOp.SUM)
    for _ in range(4):
        seq = rec.next_seq("cpu")
        FlightRecorder.done(rec.issue(seq, call), seq, None)
    rec.next_seq("cpu:p2p")
    before = rec.entries()
    assert rec.adopt(_cnative.Ring, _cnative.Counter) and not rec.adopt(_cnative.Ring, _cnative.Counter)
    assert type(rec.ring) is _cnative.Ring and rec.record == rec.ring.append
    assert rec.entries() == before and rec.issued() == 5
    assert rec.next_seq("cpu") == 5 and rec.next_seq("cpu:p2p") == 2 and rec.next_seq("cuda") == 1
    rec.issue(5, call)
    seq = rec.next_seq("cpu")
    FlightRecorder.done(rec.issue(seq, call), seq, RuntimeError("boom"))
    assert [(e["seq"], e["state"], e["error"]) for e in rec.entries()] == [
        (4, "completed", None), (5, "issued", None), (6, "failed", "RuntimeError: boom")]
    off = FlightRecorder("g", 0, 0)  # size 0: the counters only
    assert off.adopt(_cnative.Ring, _cnative.Counter) and type(off.ring).__name__ == "deque" and off.entries() == []
    assert type(off.counter("cpu")) is _cnative.Counter


_KEYS = ("seq", "op", "dtype", "count_in", "count_out", "root", "state")


def _entries(dist):
    out = []
    for e in dist.flight_recorder():
        assert e["state"] != "completed" or e["time_done"] >= e["time_issued"], e
        out.append(tuple(e[k] for k in _KEYS) + ((e["error"] or "").split(":")[0],))
    return out


def _recorded(rank, size, folder):
    """Calls through FastLane (C), the C interface's core (C), and the Python paths (async, the
    general path), one group; snapshots of the ring (size 4) as it wraps; an entry read while its
    op runs in C; an op failed in C (a mismatch: rank 0 barrier, rank 1 all_to_all_single)."""
    import ndist.collectives as col
    import ndist.distributed as dist
    from ndist.collectives import _debug, _fr_torch
    from ndist.runtime import world

    native = os.environ["NDIST_ENGINE"] == "native"
    x, y = np.ones(16, np.float32), np.arange(8, dtype=np.int64)
    dist.barrier()  # 1: the general path (the group's set-up)
    dist.all_reduce(x)  # 2: the Python lane, which asks for FastLane
    dist.all_reduce(x)  # 3: FastLane
    if native:
        assert C.Engine(col.engine_handle()).broadcast(y, 1) is None  # 4: the C interface's core
    else:
        dist.broadcast(y, src=1)
    dist.all_reduce(x, async_op=True).wait()  # 5: Python (submit)
    dist.broadcast(y, src=1)  # 6: FastLane
    snaps = [_entries(dist)]

    flag = os.path.join(folder, "seen")
    seen, t = [], None
    if not _debug.recorder_for(world.default).size:  # (nothing to see)
        pass
    elif rank == 0:  # 7 read while it runs: rank 1 calls only once this rank's reader saw it issued
        def reader():
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                last = _entries(dist)[-1:]
                if last and last[0][0] == 7:
                    seen.append(last[0])
                    open(flag, "w").close()
                    return
                time.sleep(0.001)

        t = threading.Thread(target=reader)
        t.start()
    else:
        deadline = time.monotonic() + 30
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.001)
    z = np.ones(4, np.float64)
    dist.all_reduce(z)  # 7: FastLane
    if t is not None:
        t.join()
    try:  # 8: a mismatch, in C on both ranks
        if rank == 0:
            dist.barrier()
        else:
            dist.all_to_all_single(np.empty(4, np.float32), np.ones(4, np.float32))
        err = None
    except dist.DistMismatchError as e:
        err = type(e).__name__
    dist.all_reduce(x)  # 9: the group goes on
    snaps.append(_entries(dist))
    dist.reduce(x, dst=0)  # 10: the general path
    dist.all_reduce(x)  # 11
    dist.all_reduce(x)  # 12: the failed entry is pushed out
    snaps.append(_entries(dist))
    pg = world.default
    dump = _fr_torch.torch_dump([(pg, _debug.recorder_for(pg))], pg)
    ids = [(e["record_id"], e["collective_seq_id"]) for e in dump["entries"]]
    return snaps, seen, err, ids, type(pg.fast).__name__, type(_debug.recorder_for(pg).ring).__name__


def _expected(rank: int) -> list:
    f32, i64, f64 = "float32", "int64", "float64"
    failed = ("barrier", None, 0, 0, None) if rank == 0 else ("all_to_all_single", f32, 4, 4, None)
    rows = [("barrier", None, 0, 0, None), ("all_reduce", f32, 16, 16, None), ("all_reduce", f32, 16, 16, None),
            ("broadcast", i64, 8, 8, 1), ("all_reduce", f32, 16, 16, None), ("broadcast", i64, 8, 8, 1),
            ("all_reduce", f64, 4, 4, None), failed, ("all_reduce", f32, 16, 16, None),
            ("reduce", f32, 16, 16, 0), ("all_reduce", f32, 16, 16, None), ("all_reduce", f32, 16, 16, None)]
    return [(i + 1, *row, "failed" if i + 1 == 8 else "completed", "DistMismatchError" if i + 1 == 8 else "")
            for i, row in enumerate(rows)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("engine,size", [("native", 4), ("python", 4), ("native", 0)])
def test_c_and_python_entries_on_one_group(tmp_path, engine, size):
    res = run_ranks(_recorded, 2, args=(str(tmp_path),), timeout=100,
                    env={"NDIST_ENGINE": engine, "NDIST_FLIGHT_RECORDER_SIZE": str(size)})
    for rank, (snaps, seen, err, ids, fast, ring) in enumerate(res):
        assert err == "DistMismatchError", (rank, err)
        assert (fast, ring) == (("FastLane", "Ring" if size else "deque") if engine == "native" else
                                ("PlainLane", "deque")), (fast, ring)
        want = _expected(rank)
        if not size:
            assert snaps == [[], [], []] and ids == [] and seen == [], (snaps, ids, seen)
            continue
        assert snaps == [want[2:6], want[5:9], want[8:12]], (rank, snaps)
        assert ids == [(8 + i, 9 + i) for i in range(4)], ids  # (record_id counts those pushed out)
        if rank == 0:
            assert seen == [(*want[6][:-2], "issued", "")], seen
