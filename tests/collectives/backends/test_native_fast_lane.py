"""The repeated call in one C call (``_cnative.FastLane``, native/clane.c; docs/architecture.md,
"One call, by hand"): what it runs itself gives the Python path's results, records, messages
and errors; what it does not take goes to the Python lane."""

from __future__ import annotations

import time

import numpy as np
import pytest

from ndist.testing import run_ranks

pytest.importorskip("ndist.collectives.backends.socket.native._cnative")

NATIVE = {"NDIST_ENGINE": "native"}
# AVG's finish in C: floats x / n in the dtype, integers the sum truncated toward zero
AVG_DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "float32", "float64")


def _fast_kind():
    from ndist.runtime import world

    return type(world.default.fast).__name__


def _avg(rank, size):
    import ndist.distributed as dist

    dist.barrier()  # the general path: the group's lanes exist from here
    out = {}
    for name in AVG_DTYPES + ("float16", "uint64"):  # (the last two: AVG's finish stays NumPy's)
        dt = np.dtype(name)
        signed = dt.kind == "i"
        vals = (np.arange(37) * (rank + 2) - (50 if signed else 0)).astype(dt)
        got = []
        for _ in range(3):  # the first call makes the C lane, the next ones run in it
            x = vals.copy()
            dist.all_reduce(x, op=dist.ReduceOp.AVG)
            got.append(x.tolist())
        out[name] = got
    from ndist.runtime import world

    return out, _fast_kind(), type(world.default.backend_for("cpu")._native.g).__name__


@pytest.mark.timeout(120)
@pytest.mark.parametrize("env", [NATIVE, dict(NATIVE, NDIST_TRANSPORT="tcp", NDIST_NATIVE_TCP="1")],
                         ids=["shm", "tcp"])
def test_avg_in_c_is_the_python_paths_bit_for_bit(env):
    res = run_ranks(_avg, 2, timeout=100, env=env)
    for out, kind, group in res:
        assert kind == "FastLane" and group == ("TcpGroup" if "NDIST_TRANSPORT" in env else "Group"), (kind, group)
        for name, got in out.items():
            dt = np.dtype(name)
            signed = dt.kind == "i"
            per_rank = [(np.arange(37) * (r + 2) - (50 if signed else 0)).astype(dt) for r in range(2)]
            total = per_rank[0] + per_rank[1]  # the sum in the dtype, wrapping as SUM does
            if dt.kind in "iu":
                want = np.trunc(total.astype(np.float64) / 2).astype(dt) if dt.itemsize < 8 else \
                    (total // 2 + ((total < 0) & (total % 2 != 0))).astype(dt)
            else:
                want = total / dt.type(2)
            for call in got:
                assert np.array_equal(np.array(call, dt), want), (name, call[:6], want[:6])


def _late(rank, size):
    from datetime import timedelta

    import ndist.distributed as dist

    dist.init_process_group("socket", timeout=timedelta(seconds=2))
    x = np.ones(64, np.float32)
    for _ in range(3):
        dist.all_reduce(x)
    kind = _fast_kind()
    if rank == 1:
        time.sleep(4)  # rank 0's repeated call times out waiting for this rank's data
    msg = None
    try:
        dist.all_reduce(x)
    except dist.DistTimeoutError as err:
        msg = str(err)
    rec = dist.flight_recorder()[-1]
    dist.destroy_process_group()
    return kind, msg, (rec["op"], rec["seq"], rec["state"])


@pytest.mark.timeout(120)
def test_a_timeout_in_the_c_lane_names_the_running_op_and_is_recorded():
    (kind, msg, rec), _ = run_ranks(_late, 2, init=False, timeout=100, env=NATIVE)
    assert kind == "FastLane", kind
    # the message names the op the C lane runs (NativeAlgorithms.desc through FastLane.current)
    assert msg is not None and "all_reduce float32[64] SUM #" in msg and "[1]" in msg, msg
    assert rec == ("all_reduce", 4, "failed"), rec


def _mixed(rank, size):
    import ndist.distributed as dist

    dist.barrier()
    x = np.zeros(16, np.float64)
    seen = []
    for i in range(6):
        x[:] = rank + i
        if i % 2:  # an async op queued, then a blocking one: it waits behind it (the same flag)
            work = dist.all_reduce(x, async_op=True)
            y = np.full(16, float(rank), np.float64)
            dist.broadcast(y, 1)
            work.wait()
            seen.append((x[0], y[0]))
        else:
            dist.all_reduce(x)
            seen.append((x[0], None))
    rec = dist.flight_recorder()
    return seen, [e["seq"] for e in rec], {e["state"] for e in rec}, _fast_kind()


@pytest.mark.timeout(120)
def test_c_and_python_calls_mix_in_issue_order():
    for seen, seqs, states, kind in run_ranks(_mixed, 2, timeout=100, env=NATIVE):
        assert kind == "FastLane", kind
        assert seen == [(2.0 * i + 1, None if i % 2 == 0 else 1.0) for i in range(6)], seen
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) and states == {"completed"}, (seqs, states)


def _handed_on(rank, size):
    import ndist
    import ndist.distributed as dist

    dist.barrier()
    a = np.ones(8, np.float32)
    dist.all_reduce(a)
    dist.all_reduce(a)  # the C lane from here
    got = {}
    t = ndist.ones(8)  # an ndist.Tensor: the Python lane
    dist.all_reduce(t)
    got["tensor"] = t.numpy().tolist()
    v = np.ones(16, np.float32)[::2]  # not contiguous: the general path (staged)
    dist.all_reduce(v)
    got["strided"] = v.tolist()
    ins, outs = [q + 1 for q in range(size)], [rank + 1] * size  # NumPy ints as split sizes: the general path
    uin, uout = np.full(sum(ins), rank, np.float32), np.empty(sum(outs), np.float32)
    dist.all_to_all_single(uout, uin, outs, [np.int64(s) for s in ins])
    got["uneven"] = uout.tolist()
    try:
        dist.all_reduce(np.ones(4, np.float32), op=dist.ReduceOp.BAND)  # refused as on the Python path
    except ValueError as err:
        got["band"] = str(err)
    dist.all_reduce(a)
    got["after"] = a.tolist()
    return got, _fast_kind()


def _uneven(rank, size):
    """all_to_all_single with split sizes: in C (lists of ints) on one rank while the other takes
    the Python path (NumPy ints, which FastLane and the Python lane hand on), in turn; then bad
    sizes, refused by the general path as before."""
    import sys

    import ndist
    import ndist.distributed as dist

    dist.barrier()
    for _ in range(2):  # the C lane from the second (int64 described there: no Python in later calls)
        dist.all_reduce(np.ones(4, np.int64))
    isz, osz = [2 * q + rank + 1 for q in range(size)], [2 * rank + q + 1 for q in range(size)]
    inp = np.concatenate([np.full((s, 3), 10 * rank + q, np.int64) for q, s in enumerate(isz)])
    want = np.concatenate([np.full((s, 3), 10 * q + rank, np.int64) for q, s in enumerate(osz)])
    package = ndist.__file__.rsplit("/", 1)[0] + "/"
    got, frames = [], []
    for k in range(4):
        out = np.zeros_like(want)
        python = k % size == rank  # this rank takes the Python path this time
        calls: list = []
        sys.setprofile(lambda fr, ev, _: calls.append(fr.f_code.co_name)
                       if ev == "call" and fr.f_code.co_filename.startswith(package) else None)
        try:
            dist.all_to_all_single(out, inp, osz, [np.int64(s) for s in isz] if python else tuple(isz))
        finally:
            sys.setprofile(None)
        got.append(np.array_equal(out, want))
        frames.append((python, sorted(set(calls) - {"all_to_all_single"})))
    errors = []
    for bad in ([-1] + isz[1:], isz[:-1] + [isz[-1] + 1], [True] + isz[1:], isz + [0]):
        try:
            dist.all_to_all_single(np.zeros_like(want), inp, osz, bad)
        except (ValueError, TypeError) as err:
            errors.append(f"{type(err).__name__}: {err}")
    after = np.zeros_like(want)
    dist.all_to_all_single(after, inp, osz, isz)
    keys = ("op", "dtype", "count_in", "count_out", "root", "state")
    recs = [tuple(e[k] for k in keys) for e in dist.flight_recorder()[-5:]]
    return got, frames, errors, np.array_equal(after, want), recs, _fast_kind()


def _freed_at_destroy(rank, size):
    """A group's FastLanes (its lane's and its C interface handle's: ``NativeAlgorithms.lanes``)
    are two however many calls it runs, and go when it is destroyed, without a pass of the cycle
    collector (each holds the backend, whose algorithms hold it): (lanes, FastLanes left)."""
    import gc

    import ndist.collectives as col
    import ndist.distributed as dist

    def alive():
        return sum(type(o).__name__ == "FastLane" for o in gc.get_objects())

    before = alive()
    gc.disable()
    try:
        g = dist.new_group(list(range(size)))
        for _ in range(5):
            dist.all_reduce(np.ones(8), group=g)
        col.engine_handle(g)
        col.engine_handle(g)
        lanes = len(g.backend_for("cpu")._native.lanes)
        dist.destroy_process_group(g)
        del g
        return lanes, alive() - before
    finally:
        gc.enable()


def _handed_on_and_uneven(rank, size):
    return _handed_on(rank, size), _uneven(rank, size), _freed_at_destroy(rank, size)


@pytest.mark.timeout(120)
def test_the_c_lane_runs_uneven_all_to_all_and_hands_on_the_rest_unchanged():
    """(one job for all three: what FastLane hands on, the uneven all_to_all it runs, then a
    group's FastLanes freed at its destroy)"""
    n = 2
    res = run_ranks(_handed_on_and_uneven, n, timeout=100, env=NATIVE)
    for got, kind in (r[0] for r in res):
        assert kind == "FastLane", kind
        assert got["tensor"] == [2.0] * 8 and got["strided"] == [2.0] * 8, got
        assert "band" in got, got
        assert got["uneven"] == np.repeat(np.arange(2), 2 * [got["uneven"].count(0.0)]).tolist(), got
        assert got["after"] == [8.0] * 8, got
    for rank, (got, frames, errors, after, recs, kind) in enumerate(r[1] for r in res):
        assert kind == "FastLane", kind
        assert got == [True] * 4 and after, (rank, got, after)
        for python, calls in frames:  # the C call runs no Python function; the Python path does
            assert bool(calls) == python, (rank, python, calls)
        assert [e.split(":")[0] for e in errors] == ["ValueError", "ValueError", "TypeError", "ValueError"], errors
        assert "input_split_sizes[0]: expected a size >= 0, got -1" in errors[0], errors
        assert "input_split_sizes: sizes" in errors[1] and "sum to" in errors[1], errors
        assert "input_split_sizes[0]: expected an int, got bool" in errors[2], errors
        assert f"input_split_sizes: expected {n} sizes (the group size)" in errors[3], errors
        # recorded alike by both paths and on both ranks: the input's and output's element counts
        count_in, count_out = 3 * sum(2 * q + rank + 1 for q in range(n)), 3 * sum(2 * rank + q + 1 for q in range(n))
        assert recs == [("all_to_all_single", "int64", count_in, count_out, None, "completed")] * 5, recs
    # a group's FastLanes: two, gone once it is destroyed (no collector pass needed)
    assert [r[2] for r in res] == [(2, 0)] * n, [r[2] for r in res]
