"""The flight recorder: a ring of the last N operations per group, in the
collectives layer (every backend), dumped on a timeout or a lost peer."""

import json
import time

import numpy as np
import pytest

from ndist.collectives import Call, Op, ReduceOp
from ndist.collectives._debug import FlightRecorder
from ndist.testing import run_ranks


def test_ring_keeps_the_last_n_in_order_and_tracks_state():
    rec = FlightRecorder("g", 3, 4)
    slots = []
    for i in range(1, 7):
        seq = rec.next_seq("cpu")
        call = Call(Op.ALL_REDUCE, "cpu", np.dtype("float32"), out=np.zeros(i, np.float32), redop=ReduceOp.SUM)
        slots.append((rec.issue(seq, call), seq))
    FlightRecorder.done(*slots[-1], None)
    FlightRecorder.done(*slots[-2], RuntimeError("boom"))
    FlightRecorder.done(*slots[0], None)  # reused slot: must not touch the newer entry
    entries = rec.entries()
    assert [e["seq"] for e in entries] == [3, 4, 5, 6]
    assert [e["state"] for e in entries] == ["issued", "issued", "failed", "completed"]
    assert entries[2]["error"] == "RuntimeError: boom"
    assert entries[3]["dtype"] == "float32" and entries[3]["count_in"] == 6
    assert entries[3]["time_done"] >= entries[3]["time_issued"] and entries[3]["duration_s"] >= 0
    json.dumps(entries)  # serialisable as dumped


def test_size_zero_records_nothing():
    rec = FlightRecorder("g", 0, 0)
    assert rec.issue(1, Call(Op.BARRIER, "cpu")) is None
    FlightRecorder.done(None, 1, None)
    assert rec.entries() == []


def test_recording_is_cheap():
    rec = FlightRecorder("g", 0, 64)
    x = np.zeros(4, np.float32)
    call = Call(Op.ALL_REDUCE, "cpu", x.dtype, out=x, redop=ReduceOp.SUM)
    t0 = time.perf_counter()
    for _ in range(20000):
        seq = rec.next_seq("cpu")
        FlightRecorder.done(rec.issue(seq, call), seq, None)
    per_op = (time.perf_counter() - t0) / 20000
    assert per_op < 50e-6, per_op  # a few microseconds; generous for a loaded machine


def test_call_counts_per_peer_sizes():
    a, b = np.zeros(3, np.int32), np.zeros(5, np.int32)
    dt = a.dtype
    assert Call(Op.ALL_TO_ALL, "cpu", dt, outputs=[a, b], inputs=[b, a]).counts(2) == (8, 8, [5, 3], [3, 5])
    assert Call(Op.REDUCE, "cpu", dt, out=a, root=1, redop=ReduceOp.MAX).counts(2) == (3, 3, None, None)
    assert Call(Op.GATHER, "cpu", dt, inp=a, root=0).counts(2)[:2] == (3, 0)
    # the single-buffer forms: even (no splits) and uneven
    flat = np.zeros(8, np.int32)
    assert Call(Op.ALL_TO_ALL_SINGLE, "cpu", dt, out=flat, inp=flat).counts(2) == (8, 8, [4, 4], [4, 4])
    assert Call(Op.ALL_TO_ALL_SINGLE, "cpu", dt, out=flat, inp=flat, out_splits=[3, 5],
                in_splits=[6, 2]).counts(2) == (8, 8, [6, 2], [3, 5])
    assert Call(Op.ALL_GATHER_INTO, "cpu", dt, out=flat, inp=a[:2]).counts(4) == (2, 8, None, [2, 2, 2, 2])
    assert Call(Op.REDUCE_SCATTER_FROM, "cpu", dt, out=a[:2], inp=flat).counts(4) == (8, 2, [2, 2, 2, 2], None)


def _ring(rank, size):
    import ndist.distributed as dist

    g = dist.new_group([0, 1])
    for i in range(12):
        dist.all_reduce(np.ones(i + 1, np.float32))
    dist.broadcast(np.zeros(2, np.int64), src=1, group=g)
    w = dist.all_gather_into_tensor(np.empty(4), np.ones(2), async_op=True)
    w.wait()
    return dist.flight_recorder(), dist.flight_recorder(g)


@pytest.mark.timeout(60)
def test_public_reader_per_group_across_processes():
    res = run_ranks(_ring, 2, timeout=40, env={"NDIST_FLIGHT_RECORDER_SIZE": "8"})
    for world, sub in res:
        assert len(world) == 8
        assert [e["seq"] for e in world] == list(range(6, 14))
        assert world[-1]["op"] == "all_gather_into" and world[-1]["count_out"] == 4 and world[-1]["state"] == "completed"
        assert world[-2]["count_in"] == 12 and world[-2]["dtype"] == "float32"
        assert all(e["state"] == "completed" for e in world)
        assert [(e["op"], e["root"], e["seq"], e["dtype"]) for e in sub] == [("broadcast", 1, 1, "int64")]


def test_totals_agree_with_counts_for_every_op():
    a, b, flat = np.zeros(3, np.int32), np.zeros(5, np.int32), np.zeros(8, np.int32)
    dt = a.dtype
    calls = [
        Call(Op.ALL_REDUCE, "cpu", dt, out=a, redop=ReduceOp.SUM), Call(Op.REDUCE, "cpu", dt, out=a, root=0),
        Call(Op.BROADCAST, "cpu", dt, out=a, root=1), Call(Op.SEND, "cpu", dt, out=a, root=1),
        Call(Op.RECV, "cpu", dt, out=a), Call(Op.BARRIER, "cpu"),
        Call(Op.REDUCE_SCATTER, "cpu", dt, out=a, inputs=[a, a]),
        Call(Op.REDUCE_SCATTER_FROM, "cpu", dt, out=flat[:4], inp=flat),
        Call(Op.ALL_GATHER, "cpu", dt, inp=a, outputs=[a, b]), Call(Op.ALL_GATHER_INTO, "cpu", dt, out=flat, inp=flat[:4]),
        Call(Op.GATHER, "cpu", dt, inp=a, outputs=[a, a], root=0), Call(Op.GATHER, "cpu", dt, inp=a, root=0),
        Call(Op.SCATTER, "cpu", dt, out=a, inputs=[a, a], root=0), Call(Op.SCATTER, "cpu", dt, out=a, root=0),
        Call(Op.ALL_TO_ALL, "cpu", dt, outputs=[a, b], inputs=[b, a]),
        Call(Op.ALL_TO_ALL_SINGLE, "cpu", dt, out=flat, inp=flat, out_splits=[3, 5], in_splits=[6, 2]),
    ]
    assert {c.op for c in calls} == set(Op)
    for c in calls:
        assert c.totals() == c.counts(2)[:2], c.op


def _refused_on_revoked(rank, size, folder):
    import os
    import signal

    import ndist.distributed as dist
    from tests.kill_sync import all_past

    x = np.ones(4, np.float32)
    dist.all_reduce(x)  # recorded: completed
    dist.barrier()
    all_past(os.path.join(folder, "past"), rank, 3, victim=2)
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    deadline = time.monotonic() + 30
    while 2 not in dist.get_failed_ranks():  # the member watch saw it go: the group is revoked
        assert time.monotonic() < deadline, "rank 2's loss was never seen"
        time.sleep(0.01)
    out = {}
    calls = [("all_reduce", lambda: dist.all_reduce(x)),  # the repeated call's path: its lane is gone
             ("broadcast", lambda: dist.broadcast(x, src=0, async_op=True).wait()),
             ("send", lambda: dist.send(x, dst=1 - rank))]
    for name, call in calls:
        try:
            call()
            out[name] = "no error"
        except dist.DistError as err:
            out[name] = type(err).__name__
    out["ring"] = [(e["op"], e["state"], e["error"] or "") for e in dist.flight_recorder()]
    with open(os.path.join(folder, f"rank{rank}.json")) as f:
        out["dump"] = [(e["op"], e["state"]) for e in json.load(f)["groups"]["0"]]
    return out


@pytest.mark.timeout(90)
@pytest.mark.parametrize("engine", ["native", "python"])
def test_a_call_refused_by_a_revoked_group_is_recorded_failed_and_dumped(tmp_path, engine):
    """A survivor told of a loss between two calls (the member watch revoked the group) has
    its next calls refused before they reach a backend; each is still numbered, recorded as
    failed with the group's error, and the rings are dumped, as for a call that was running
    when the member died. (CI: a survivor of a SIGKILL mid all_to_all that learnt of it
    between two calls left no dump.)"""
    res = run_ranks(_refused_on_revoked, 3, args=(str(tmp_path),), timeout=60, may_die=[2],
                    env={"NDIST_FLIGHT_RECORDER_DIR": str(tmp_path), "NDIST_ENGINE": engine})
    for rank in (0, 1):
        out = res[rank]
        assert {k: out[k] for k in ("all_reduce", "broadcast", "send")} == dict.fromkeys(
            ("all_reduce", "broadcast", "send"), "DistRankFailureError"), out
        ring = out["ring"]
        assert [(op, state) for op, state, _ in ring] == [
            ("all_reduce", "completed"), ("barrier", "completed"), ("all_reduce", "failed"),
            ("broadcast", "failed"), ("send", "failed")], ring
        assert all("DistRankFailureError" in err and "rank 2" in err for _, _, err in ring[2:]), ring
        assert out["dump"] == [(op, state) for op, state, _ in ring], out["dump"]
