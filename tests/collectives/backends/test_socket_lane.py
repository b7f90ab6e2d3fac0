"""The socket backend's thin lane (``SocketBackend._inline``): a blocking collective on
the native engine with nothing running or queued runs on the caller's thread without
``_submit``'s closure, Work or executor job, numbered and recorded as before; anything
queued keeps the executor's order; bad input still fails before the backend."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from ndist.testing import run_ranks
from tests.collectives.backends._socket_bodies import op_buffers

pytest.importorskip("ndist.collectives.backends.socket.native._cnative")

SOCKET = "ndist/collectives/backends/socket/"


def _traced(fn, where=SOCKET):
    """The names (``file:function``) of the Python functions under ``where`` (default:
    the socket backend) that ``fn()`` calls."""
    seen = set()

    def prof(frame, event, arg):
        if event == "call":
            path = frame.f_code.co_filename.replace("\\", "/")
            if where in path:
                seen.add(f"{path.rsplit('/', 1)[-1]}:{frame.f_code.co_name}")

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def _lane(rank, size):
    import ndist.distributed as dist

    n = 8 * size
    full, out, part, part_out, ins, outs, uin, uout = op_buffers(rank, size, 8, 100)
    dist.barrier()  # the group's first collective: the engine is up
    calls = {
        "all_reduce": lambda: dist.all_reduce(full),
        "broadcast": lambda: dist.broadcast(full, 1),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(out, part),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(part_out, full),
        "all_to_all_single": lambda: dist.all_to_all_single(out, full),
        "all_to_all_single uneven": lambda: dist.all_to_all_single(uout, uin, outs, ins),
        "barrier": lambda: dist.barrier(),
    }
    seen = {}
    for name, fn in calls.items():
        fn()  # a first call on these buffers (the group's fast lane is set up by then)
        fn()  # (the compiled lane's first sight of the dtype asks native/_fast.py once)
        seen[name] = _traced(fn)  # then the traced repeated one
    # results of the traced calls (every rank's values known)
    full[:] = np.arange(n) + 100 * rank
    dist.all_reduce(full)
    assert (full == size * np.arange(n) + 100 * sum(range(size))).all(), full
    dist.all_gather_into_tensor(out, part)
    assert (out == np.repeat(np.arange(size), 8)).all(), out
    dist.all_to_all_single(uout, uin, outs, ins)
    assert (uout == np.repeat(np.arange(size), outs)).all(), uout
    rec = dist.flight_recorder()
    return seen, dist.get_engine(), [(e["op"], e["state"]) for e in rec[-3:]], [e["seq"] for e in rec]


def _lane_and_group(rank, size):
    """``_lane``, and the name of the compiled group's class its native engine runs."""
    from ndist.runtime import resolve_group

    res = _lane(rank, size)
    return res, type(resolve_group(None).backend_for("cpu")._native.g).__name__


def _traced_api(fn):
    """The names of ndist.collectives' Python functions ``fn()`` calls."""
    return _traced(fn, "ndist/collectives/")


def _barrier_repeated(rank, size):
    import ndist.distributed as dist

    g = dist.new_group(list(range(size)))
    dist.barrier(group=g)  # the group's first collective: the general path
    first = [e["op"] for e in dist.flight_recorder(g)]
    seen = _traced_api(lambda: dist.barrier(group=g))
    errors = []
    for bad in (3, "0"):
        try:
            dist.barrier(group=g, device_ids=bad)
        except TypeError as err:
            errors.append(str(err))
    dist.barrier(group=g, async_op=True).wait()  # the general path again, numbered after it
    rec = [(e["seq"], e["op"], e["dtype"], e["count_in"], e["count_out"], e["root"], e["state"])
           for e in dist.flight_recorder(g)]
    dist.destroy_process_group(g)
    return first, seen, errors, rec


@pytest.mark.timeout(120)
def test_a_repeated_barrier_takes_the_plain_path_and_the_lane():
    for first, seen, errors, rec in run_ranks(_barrier_repeated, 2, timeout=100, env={"NDIST_ENGINE": "native"}):
        assert first == ["barrier"], first
        # the repeated call: _common.run_fields (or its C twin, which a profile of Python
        # calls does not see), not submit; the backend's thin lane, no executor job
        assert "_api.py:barrier" in seen and "_backend.py:_inline" in seen, sorted(seen)
        assert not {"_common.py:submit", "_common.py:member_group", "_backend.py:_submit",
                    "_executor.py:run_inline"} & seen, sorted(seen)
        # device_ids is still checked (general path), and nothing was numbered for it
        assert len(errors) == 2 and all("device_ids: expected a list of ints or None" in e for e in errors), errors
        assert rec == [(s, "barrier", None, 0, 0, None, "completed") for s in (1, 2, 3)], rec


#: the ops whose repeated blocking call is one C call on the native engine (``_cnative.FastLane``)
ONE_C_CALL = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
              "all_to_all_single uneven", "barrier")


@pytest.mark.timeout(120)
def test_a_blocking_call_on_an_idle_group_takes_the_lane():
    for res in run_ranks(_lane, 2, timeout=100, env={"NDIST_ENGINE": "native"}):
        _check_lane(*res)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("two_level_min", ["0", "1048576"])
def test_a_blocking_call_on_a_two_level_group_is_one_c_call(two_level_min):
    """A group across hosts with two ranks on each (2 simulated hosts of 2) runs its
    repeated blocking call in one C call too (``ctwo.c`` behind FastLane), for calls above
    the two-level minimum (0: every call in two levels) and below it (direct on the whole
    TCP group)."""
    env = {"NDIST_ENGINE": "native", "NDIST_NATIVE_HOSTS": "2", "NDIST_NATIVE_TWO_LEVEL_MIN": two_level_min}
    for res, group in run_ranks(_lane_and_group, 4, timeout=100, env=env):
        assert group == "TwoLevelGroup"
        _check_lane(*res)


def _check_lane(seen, engine, last, seqs):
    """What a blocking call on an idle native group takes (``_lane``'s answer on one rank)."""
    assert engine == "native"
    for name, fns in seen.items():
        if name in ONE_C_CALL:  # the public function's frame, then one C call (native/clane.c)
            assert fns == set(), (name, sorted(fns))
            continue
        assert "_backend.py:_inline" in fns, (name, sorted(fns))
        # no closure, no Work, no executor job: _submit and run_inline are not called
        assert not {"_backend.py:_submit", "_executor.py:run_inline", "_executor.py:submit"} & fns, \
            (name, sorted(fns))
    # recorded as before: completed, numbered one after the other
    assert last == [("all_reduce", "completed"), ("all_gather_into", "completed"),
                    ("all_to_all_single", "completed")], last
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs


def _queued(rank, size):
    import ndist.distributed as dist

    dist.barrier()
    big = np.full(1 << 18, rank + 1, np.float64)  # 2 MiB: still running when the next call comes
    small = np.full(16, rank + 1, np.int32)
    names = set()
    for _ in range(5):
        work = dist.all_reduce(big, async_op=True)
        names |= _traced(lambda: dist.all_reduce(small))  # queued behind it, or the lane once it is done
        work.wait()
        assert (big == 3).all() and (small == 3).all(), (big[:2], small[:2])
        big[:] = rank + 1
        small[:] = rank + 1
    rec = dist.flight_recorder()
    return names, [e["seq"] for e in rec], [e["state"] for e in rec]


@pytest.mark.timeout(120)
def test_a_call_behind_queued_work_keeps_the_order():
    for names, seqs, states in run_ranks(_queued, 2, timeout=100, env={"NDIST_ENGINE": "native"}):
        # ranks issue alike; a blocking call never overtakes the async one before it
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
        assert set(states) == {"completed"}, states
        assert "_backend.py:_inline" in names or "_backend.py:_submit" in names, sorted(names)


def test_the_executor_keeps_the_facts_the_c_claim_reads():
    """``LaneState`` (native/clane.c) holds what the C core's claim reads without the GIL: the
    busy flag, the numbers (one atomic add each) and the queue's length, which the executor
    stores at each append and pop (a job queued behind a claim counts until the worker pops it)."""
    import threading

    from ndist.collectives.backends.socket._executor import Executor
    from ndist.collectives.backends.socket.native import _cnative
    from ndist.runtime import Work

    st = _cnative.LaneState()
    ex = Executor("t", st)
    try:
        assert ex.claim() == 1 and st.busy and st.seq == 1 and st.queued == 0
        ran = threading.Event()
        work = ex.submit(Work("job", ex.number()), ran.set, blocking=False)  # (queued: the flag is taken)
        assert st.queued == 1 and st.seq == 2 and not ran.is_set()
        ex.leave()
        assert work.wait(timeout=10) and ran.is_set() and st.queued == 0 and not st.busy
        assert not st.closed and not st.broken
        st.closed = st.broken = True
        assert st.closed and st.broken
        with pytest.raises(ValueError, match="queued: expected an int in"):
            st.queued = -1
    finally:
        ex.close("test over")


def _state(compiled: bool):
    from ndist.collectives.backends.socket.native import _cnative

    return _cnative.LaneState() if compiled else None


STATES = pytest.mark.parametrize("compiled", [True, False], ids=["LaneState", "PyState"])


@STATES
def test_the_executor_and_its_backend_read_one_closed_flag(compiled):
    """``state.closed`` is the only "closed": ``SocketBackend.close`` sets it first, and from
    then on the executor claims and runs nothing (the C core's claim reads the same flag);
    ``Executor.close`` sets it too."""
    from ndist.collectives.backends.socket._executor import Executor
    from ndist.runtime import DistBackendError, Work

    ex = Executor("t", _state(compiled))
    ran = []
    try:
        ex.state.closed = True  # (what SocketBackend.close does first)
        assert ex.closed
        assert ex.claim() == 0 and not ex.run_inline(lambda: ran.append("inline"))
        work = ex.submit(Work("job", 1), lambda: ran.append("submitted"), blocking=True)
        assert isinstance(work.exception(), DistBackendError) and not ran, (work.exception(), ran)
    finally:
        ex.close("test over")
    other = Executor("u", _state(compiled))
    other.close("test over")
    assert other.closed and other.state.closed


def _drained(ex, hold):
    """``ex.drain`` on a thread of its own while ``hold(draining)`` keeps ``ex`` busy and ends
    its job once a thread drains (``draining()`` is true): (drain's result, the number of
    times it waited on the executor's condition)."""
    import threading
    import time

    wait_code = threading.Condition.wait.__code__
    waits, result = [], []

    def drainer():
        def prof(frame, event, arg):
            if event == "call" and frame.f_code is wait_code:
                waits.append(1)

        sys.setprofile(prof)
        try:
            result.append(ex.drain(time.monotonic() + 60))
        finally:
            sys.setprofile(None)

    def draining() -> bool:
        deadline = time.monotonic() + 30
        while not ex.state.drainers and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.2)  # (a drain that looked every 50 ms would have looked again by now)
        return bool(ex.state.drainers)

    t = threading.Thread(target=drainer, daemon=True)
    hold(t, draining)
    t.join(30)
    return result, len(waits)


@STATES
@pytest.mark.parametrize("end", ["leave", "run_inline"])
def test_drain_is_woken_by_an_inline_job_s_end(compiled, end):
    """A thread in ``drain`` behind a job run on the caller's thread (the thin lane's
    ``claim`` / ``leave``, or ``run_inline``) is woken by that job's end: it waits on the
    condition once, not in ticks."""
    from ndist.collectives.backends.socket._executor import Executor

    ex = Executor("t", _state(compiled))
    seen = []

    def hold(t, draining):
        if end == "leave":
            assert ex.claim() == 1
            t.start()
            seen.append(draining())
            ex.leave()
        else:
            assert ex.run_inline(lambda: (t.start(), seen.append(draining())))

    try:
        result, waits = _drained(ex, hold)
    finally:
        ex.close("test over")
    assert seen == [True] and result == [True] and waits == 1, (seen, result, waits)
    assert ex.state.drainers == 0


def _drain_behind_a_c_call(rank, size, folder):
    """Rank 0: a thread's all_reduce holds the lane in FastLane (C, the GIL released: it waits
    for rank 1, which comes once rank 0's main thread drains the executor). The C core's end
    wakes the drain: (drain's result, how long it took, the lane's type)."""
    import os
    import threading
    import time

    import ndist.distributed as dist

    flag = os.path.join(folder, "draining")
    x = np.ones(512, np.float32)
    dist.all_reduce(x)
    dist.all_reduce(x)  # (the group's FastLane is made after its first call)
    if rank == 1:
        deadline = time.monotonic() + 60
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(0.2)
        dist.all_reduce(x)
        return None
    ex = dist.group.WORLD.backend_for("cpu")._exec
    lane = type(dist.group.WORLD.fast).__name__
    t = threading.Thread(target=dist.all_reduce, args=(x,))
    t.start()
    deadline = time.monotonic() + 30
    while not ex.state.busy and time.monotonic() < deadline:
        time.sleep(0.0005)

    def tell():
        while not ex.state.drainers and time.monotonic() < deadline:
            time.sleep(0.001)
        with open(flag, "w"):
            pass

    teller = threading.Thread(target=tell)
    teller.start()
    t0 = time.monotonic()
    ok = ex.drain(t0 + 20)
    took = time.monotonic() - t0
    t.join(30)
    teller.join(30)
    return ok, took, lane, float(x[0])


@pytest.mark.timeout(120)
def test_drain_is_woken_by_the_c_core_s_end(tmp_path):
    res = run_ranks(_drain_behind_a_c_call, 2, args=(str(tmp_path),), timeout=100, env={"NDIST_ENGINE": "native"})
    ok, took, lane, value = res[0]
    assert lane == "FastLane" and ok and value == 8.0, res[0]
    assert took < 10, took  # (not woken, it would wait out its 20 s)


def _bad_then_good(rank, size):
    import ndist.distributed as dist

    dist.barrier()
    out, inp = np.empty(4, np.float32), np.ones(4, np.float32)
    errors = []
    for sizes in ([1, 2], [1.0, 3], (4,), "ab"):
        try:
            dist.all_to_all_single(out, inp, sizes, sizes)
        except (ValueError, TypeError) as err:
            errors.append(type(err).__name__)
    dist.all_to_all_single(out, inp, [2, 2], [2, 2])  # the group stays usable
    return errors, out.tolist()


@pytest.mark.timeout(120)
def test_bad_split_sizes_still_fail_before_the_backend():
    for errors, out in run_ranks(_bad_then_good, 2, timeout=100, env={"NDIST_ENGINE": "native"}):
        assert errors == ["ValueError", "TypeError", "ValueError", "TypeError"], errors
        assert out == [1.0] * 4


def _cut_counts(rank, size):
    import ndist.distributed as dist
    from ndist.runtime import resolve_group

    dist.barrier()
    nat = resolve_group(None).backend_for("cpu")._native
    out, inp = np.empty(6, np.float32), np.full(6, rank, np.float32)
    errors = []
    for oc, ic in (([1, 9], [3, 3]), ([3, 3], [3, 3, 0]), ([3, -1], [3, 3])):
        try:  # refused in C before anything is posted: the group stays usable
            nat.g.all_to_all(out, inp, nat._code(out.dtype), oc, ic, 4)
        except ValueError as err:
            errors.append(str(err))
    outs, ins = [q + 1 + rank for q in range(size)], [rank + 1 + q for q in range(size)]
    uin, uout = np.full(sum(ins), rank, np.float32), np.empty(sum(outs), np.float32)
    dist.all_to_all_single(uout, uin, outs, ins)
    return errors, uout.tolist()


@pytest.mark.timeout(120)
def test_cut_counts_are_checked_in_c():
    for rank, (errors, out) in enumerate(run_ranks(_cut_counts, 2, timeout=100, env={"NDIST_ENGINE": "native"})):
        assert len(errors) == 3 and "counts past the end of a buffer of 24 bytes" in errors[0], errors
        assert "expected 2 counts" in errors[1] and "past the end" in errors[2], errors
        assert out == [float(q) for q in range(2) for _ in range(q + 1 + rank)], out


def _barrier_detail(rank, size):
    import ndist.distributed as dist

    dist.barrier()  # the general path: the group's CPU lane exists from here
    seen = _traced_api(dist.barrier)
    msg = None
    try:
        if rank == 0:
            dist.barrier()  # the repeated call, checked against rank 1's call through the store
        else:
            dist.all_reduce(np.ones(2))
    except dist.DistMismatchError as err:
        msg = str(err)
    dist.barrier()  # the group goes on
    return seen, msg, [(e["seq"], e["op"], e["state"]) for e in dist.flight_recorder()][-3:]


@pytest.mark.timeout(120)
def test_a_repeated_barrier_keeps_the_detail_check():
    res = run_ranks(_barrier_detail, 2, timeout=100, env={"NDIST_ENGINE": "native", "NDIST_DEBUG": "DETAIL"})
    for rank, (seen, msg, last) in enumerate(res):
        # the plain path (run_fields, or its C twin: no Python frame of its own) calls the check
        assert "_debug.py:check_signature" in seen and "_common.py:submit" not in seen, sorted(seen)
        assert msg is not None and "(NDIST_DEBUG=DETAIL)" in msg and "barrier" in msg and "all_reduce" in msg, msg
        assert [s for s, _, _ in last] == [2, 3, 4] and last[1][2] == "failed" and last[2][2] == "completed", last
