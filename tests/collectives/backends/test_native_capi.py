"""The engine's C interface (``native/ndist_engine.h``, ``capi.c``, ``_capi.py``; docs/native.md,
"The C interface"): the C test program ``capi_test.c`` on real ranks (and its thread's calls
while a Python thread holds the GIL), the table's results
against NumPy bit for bit, calls that mix with ``ndist.distributed``'s on one group, and the
error statuses (bad arguments, a mismatch, a peer killed mid-call, a destroyed group)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.collectives.backends import _capi_ctypes as C

pytest.importorskip("ndist.collectives.backends.socket.native._cnative")
pytestmark = pytest.mark.timeout(180)

NATIVE = {"NDIST_ENGINE": "native"}
#: the one-level native engines: same-host (shared memory) and TCP (here on one host, as the suites run it)
ENGINES = {"shm": {}, "tcp": {"NDIST_TRANSPORT": "tcp", "NDIST_NATIVE_TCP": "1"}}
needs_cc = pytest.mark.skipif(C.compiler() is None, reason="no C compiler")


def _handle():
    import ndist.collectives as col
    import ndist.distributed as dist

    dist.barrier()  # the group's set-up (its first collective)
    return col.engine_handle()


def _records():
    import ndist.distributed as dist

    return [(e["seq"], e["op"], e["dtype"], e["count_in"], e["count_out"], e["root"], e["state"])
            for e in dist.flight_recorder()]


def _alike(records):
    """``_records()`` as every rank's must agree: all_to_all's counts left out (with split sizes
    each rank sends and receives its own)"""
    return [r[:3] + r[5:] if r[1] == "all_to_all_single" else r for r in records]


# ------------------------------------------------------------------ the header
def test_the_header_agrees_with_the_module():
    from ndist.collectives.backends.socket.native import _capi, _cnative

    text = (C.HERE.parents[2] / "ndist/collectives/backends/socket/native/ndist_engine.h").read_text()
    assert os.path.samefile(os.path.join(C.include_dir(), "ndist_engine.h"),
                            C.HERE.parents[2] / "ndist/collectives/backends/socket/native/ndist_engine.h")
    assert f"#define NDIST_ENGINE_API_VERSION {_cnative.CAPI_VERSION}\n" in text
    body = re.search(r"enum ndist_status \{(.*?)\};", text, re.S).group(1)
    names = re.findall(r"^\s*NDIST_(OK|E_\w+)", body, re.M)
    assert [n.removeprefix("E_") for n in names] == ["OK", "ARGUMENT", "PEER_LOST", "TIMEOUT", "MISMATCH", "BROKEN",
                                                    "CLOSED", "INTERRUPTED", "INTERNAL"]
    assert [getattr(_capi, n.removeprefix("E_")) for n in names] == list(range(len(names)))
    assert C.table().version == _cnative.CAPI_VERSION
    assert C.table().size == ctypes_size()


def ctypes_size() -> int:
    import ctypes

    return ctypes.sizeof(C._api_type(False))


@needs_cc
@pytest.mark.parametrize("lang", ["c", "c++"])
def test_the_header_compiles_alone(tmp_path, lang):
    cc = C.compiler() if lang == "c" else next((c for c in ("c++", "g++") if __import__("shutil").which(c)), None)
    if cc is None:
        pytest.skip("no C++ compiler")
    src = tmp_path / ("t.c" if lang == "c" else "t.cc")
    src.write_text('#include "ndist_engine.h"\nint f(const ndist_engine_api *a) { return (int)a->size; }\n')
    std = "-std=c99" if lang == "c" else "-std=c++17"
    subprocess.run([cc, std, "-Wall", "-Wextra", "-Werror", "-pedantic", "-c", f"-I{C.include_dir()}", str(src), "-o",
                    str(tmp_path / "t.o")], check=True)


# ------------------------------------------------------------------ the C program
def _selftest(rank, size, library):
    import ndist.distributed as dist

    h = _handle()
    rc, why = C.selftest(library, h)
    dist.barrier()
    recs = _records()
    gil = None
    if size == 2:
        folder = os.path.dirname(library)
        gil = (_calls_while_python_holds_the_gil(rank, h, library, GIL_CALLS),
               _queued_while_a_c_call_runs(rank, h, library, folder),
               _wake_fails_after_a_call(rank, h, library, folder, "core"),
               _wake_fails_after_a_call(rank, h, library, folder, "hooks"))
    return rc, why, recs, type(dist.group.WORLD.backend_for("cpu")._native.g).__name__, gil


#: the calls rank 0's C thread makes while its main thread holds the GIL
GIL_CALLS = 100


def _queued_while_a_c_call_runs(rank, h, library, folder):
    """Rank 0's C thread makes a call that waits in the engine for rank 1 (the lane claimed,
    without the GIL), and its main thread queues an async all_reduce meanwhile (queued: the
    lane is busy); rank 1 comes once it is queued. The C core's end sees the job and wakes the
    executor's worker (with the GIL): the job runs after the call, on every rank."""
    import ndist.distributed as dist

    flag = os.path.join(folder, "queued")
    x = np.full(64, float(rank + 1))
    if rank != 0:
        deadline = time.monotonic() + 60
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.002)
        y = np.ones(512)
        dist.all_reduce(y)  # (the C call's match)
        dist.all_reduce(x)  # (the async one's)
        return None
    state = dist.group.WORLD.backend_for("cpu")._exec.state
    c = C.Calls(library, h, 1, 512)
    deadline = time.monotonic() + 60
    while not state.busy and time.monotonic() < deadline:
        time.sleep(0.001)
    busy = state.busy
    work = dist.all_reduce(x, async_op=True)
    queued = state.queued
    with open(flag, "w"):
        pass
    done = work.wait(timeout=30)
    c.go()
    rc, why = c.join()
    return busy, queued, done, rc, why, x.tolist()


class _FailsOnce:
    """The executor's lock, whose first ``with`` raises (waking the executor's worker fails
    once: a MemoryError or an exception sent to the thread would), then the lock itself."""

    def __init__(self, lock) -> None:
        self.lock, self.raised = lock, False

    def __enter__(self):
        if not self.raised:
            self.raised = True
            raise RuntimeError("the wake failed (injected)")
        return self.lock.__enter__()

    def __exit__(self, *exc):
        return self.lock.__exit__(*exc)


def _wake_fails_after_a_call(rank, h, library, folder, path):
    """As ``_queued_while_a_c_call_runs``, but waking the executor's worker at the call's end
    fails once: the call's status is OK and its result valid (the op ran), the wake's error goes
    to ``sys.unraisablehook``, and the worker is woken once more, so the queued job runs.
    ``path``: "core" (the C thread of ``capi_test.c``: float64 SUM, which the C core runs) or
    "hooks" (a Python thread's call through ctypes, without the GIL: uint64 AVG, which the C core
    leaves to the Python hooks, ``_capi.Handle``). Rank 0: (status, why, the job done, its
    result, the hooks' call's result, what the hook saw); the others: their result of the call."""
    import threading

    import ndist.distributed as dist

    flag = os.path.join(folder, f"wake-{path}")
    x = np.full(64, float(rank + 1))
    y, op = (np.ones(512), dist.ReduceOp.SUM) if path == "core" else \
        (np.full(512, 10 * (rank + 1), np.uint64), dist.ReduceOp.AVG)
    if rank != 0:
        deadline = time.monotonic() + 60
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.002)
        dist.all_reduce(y, op=op)  # (the call's match)
        dist.all_reduce(x)  # (the async one's)
        return y.tolist()
    ex = dist.group.WORLD.backend_for("cpu")._exec
    if path == "core":
        c = C.Calls(library, h, 1, 512)
    else:
        got = {}
        t = threading.Thread(target=lambda: got.update(err=C.Engine(h).all_reduce(y, "AVG")))
        t.start()
    deadline = time.monotonic() + 60
    while not ex.state.busy and time.monotonic() < deadline:
        time.sleep(0.001)
    work = dist.all_reduce(x, async_op=True)
    seen = []
    hook, sys.unraisablehook = sys.unraisablehook, lambda a: seen.append(repr(a.exc_value))
    lock, ex._lock = ex._lock, _FailsOnce(ex._lock)
    try:
        with open(flag, "w"):
            pass
        done = work.wait(timeout=30)
        if path == "core":
            c.go()
            rc, why = c.join()
        else:
            t.join(60)
            rc, why = (0, "") if got.get("err") is None else (1, repr(got.get("err")))
    finally:
        ex._lock, sys.unraisablehook = lock, hook
    # (the C thread checks its own result, in C: the group's size everywhere)
    return rc, why, done, x.tolist(), None if path == "core" else y.tolist(), seen


def _calls_while_python_holds_the_gil(rank, h, library, calls):
    """Rank 0: a C thread of ``capi_test.c``'s makes ``calls`` table calls, after a first one
    (which takes the GIL: the thread's first call, the dtype's first sight), while the main
    thread runs Python that never lets the GIL go (a busy loop, with ``sys.setswitchinterval``
    set past the test's length: no other thread gets the GIL meanwhile; the thread's calls
    start from inside it, ``go``); the other ranks make the matching calls through
    ndist.distributed. (held calls or None, status, why, the flight recorder's entries)."""
    import sys as _sys

    import ndist.distributed as dist

    if rank != 0:
        size = dist.get_world_size()
        for _ in range(calls + 1):
            y = np.ones(512)
            dist.all_reduce(y)
            assert (y == size).all(), y
        dist.barrier()
        return None, 0, "", _records()
    c = C.Calls(library, h, calls + 1, 512)
    deadline = time.monotonic() + 60
    while c.done() < 1 and time.monotonic() < deadline:  # (the GIL free meanwhile)
        time.sleep(0.001)
    interval = _sys.getswitchinterval()
    _sys.setswitchinterval(1000.0)
    try:
        c.go()
        end = time.monotonic() + 10
        while c.done() <= calls and time.monotonic() < end:  # (no call here lets the GIL go)
            pass
        held = c.done() - 1
    finally:
        _sys.setswitchinterval(interval)
    rc, why = c.join()
    dist.barrier()
    return held, rc, why, _records()


@needs_cc
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("n", [2, 4])
def test_the_c_program_passes_on_real_ranks(tmp_path, n, engine):
    lib = C.build_library(tmp_path)
    res = run(_selftest, n, str(lib), env=ENGINES[engine])
    for rank, (rc, why, _, kind, _) in enumerate(res):
        assert rc == 0, (rank, why)
        assert kind == {"shm": "Group", "tcp": "TcpGroup"}[engine]
    # every call was numbered and recorded alike on every rank (the refused ones not at all)
    assert all(_alike(r[2]) == _alike(res[0][2]) for r in res), [r[2] for r in res]
    seqs = [s for s, *_ in res[0][2]]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
    assert all(e[-1] == "completed" for e in res[0][2]), res[0][2]
    # then (n = 2) the program's thread again: a call the C core takes needs no GIL (after the
    # thread's first call and the dtype's first sight), so its calls run while rank 0's main
    # thread holds the GIL throughout, numbered and recorded as ever (the recorder's 64 entries wrapping)
    if n != 2:
        return
    (held, rc, why, recs), (busy, queued, done, qrc, qwhy, x) = res[0][4][:2]
    assert qrc == 0, qwhy
    assert busy and queued == 1 and done and x == [3.0] * 64, (busy, queued, done, x)
    # a call whose op ran is OK even when waking the worker after it failed (its error reported)
    for k, path in ((2, "core"), (3, "hooks")):
        (wrc, wwhy, wdone, wx, wy, seen), theirs = res[0][4][k], res[1][4][k]
        assert wrc == 0, (path, wwhy)
        assert wdone and wx == [3.0] * 64, (path, wdone, wx)
        assert path == "core" or wy == theirs, (wy[:4], theirs[:4])
        assert len(seen) == 1 and "the wake failed (injected)" in seen[0], (path, seen)
    assert rc == 0, why
    assert held == GIL_CALLS, f"{held} of {GIL_CALLS} calls ran while the GIL was held"
    assert all(r[4][0][3] == recs for r in res) and len(recs) == 64  # (the last 63 calls, the barrier)
    assert [r[1:] for r in recs[:-1]] == [("all_reduce", "float64", 512, 512, None, "completed")] * 63
    assert recs[-1][1] == "barrier" and [r[0] for r in recs] == list(range(recs[0][0], recs[0][0] + 64))


def run(fn, n, *args, **kw):
    from ndist.testing import run_ranks

    return run_ranks(fn, n, args=args, timeout=150, env=dict(NATIVE, **kw.pop("env", {})), **kw)


@needs_cc
def test_the_c_program_embedding_python_runs_under_ndistrun(tmp_path):
    """The same test as a program of its own (``-DCAPI_TEST_MAIN``: it embeds CPython, sets the
    group up through ndist and calls the table from a thread it made), started by ndistrun."""
    import sysconfig

    if not sysconfig.get_config_var("LDVERSION") or not (sysconfig.get_config_var("Py_ENABLE_SHARED") or
                                                         sysconfig.get_config_var("LIBRARY")):
        pytest.skip("no libpython to embed")
    try:
        prog = C.build_program(tmp_path)
    except subprocess.CalledProcessError as err:
        pytest.skip(f"cannot link an embedding program here: {err.stderr[-400:]}")
    env = dict(os.environ, **NATIVE, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-m", "ndist.launch", "--nproc-per-node", "2", "--no-python", str(prog)],
                       capture_output=True, text=True, timeout=150, env=env)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])


# ------------------------------------------------------------------ results and bookkeeping
def _inputs(q, dt, count):
    rng = np.random.default_rng(1000 + q)
    if np.dtype(dt).kind == "i":
        return rng.integers(-40, 40, count).astype(dt)
    return (rng.standard_normal(count) * 8).astype(dt)


def _fold(op, dt, n, count, block=None):
    """What the engine computes: the ranks' inputs folded in rank order (AVG: the sum over n,
    as ``finalize``)."""
    f = {"SUM": np.add, "AVG": np.add, "PRODUCT": np.multiply, "MIN": np.minimum, "MAX": np.maximum}[op]
    xs = [_inputs(q, dt, count) for q in range(n)]
    if block is not None:
        xs = [x[block] for x in xs]
    acc = xs[0].copy()
    for x in xs[1:]:
        f(acc, x, out=acc)
    if op == "AVG":
        np.divide(acc, acc.dtype.type(n), out=acc)
    return acc


def _bitwise(rank, size):
    import ndist.distributed as dist

    h = _handle()
    engines = (C.Engine(h), C.Engine(h, gil=True))  # without the GIL (CFUNCTYPE) and with it
    bad = []
    k = 0
    for dt in (np.float32, np.float64, np.int32):
        for op in ("SUM", "PRODUCT", "MIN", "MAX", "AVG"):
            if op == "AVG" and dt is np.int32:
                continue
            for count in (1000, 70000):  # 70000 x 4 or 8 bytes: above 256 KiB, reduce-scatter + all-gather
                x = _inputs(rank, dt, count)
                err = engines[k % 2].all_reduce(x, op)
                k += 1
                want = _fold(op, dt, size, count)
                if err is not None or x.tobytes() != want.tobytes():
                    bad.append(("all_reduce", np.dtype(dt).name, op, count, err))
    # reduce_scatter: rank r gets block r of the folded inputs
    n_out = 3000
    inp = _inputs(rank, np.float32, n_out * size)
    out = np.empty(n_out, np.float32)
    err = engines[0].reduce_scatter(out, inp, "SUM")
    want = _fold("SUM", np.float32, size, n_out * size, slice(rank * n_out, (rank + 1) * n_out))
    if err is not None or out.tobytes() != want.tobytes():
        bad.append(("reduce_scatter", err))
    # all_gather, all_to_all, broadcast: the bytes moved
    x = _inputs(rank, np.float64, 5000)
    out = np.empty(5000 * size)
    err = engines[1].all_gather(out, x)
    if err is not None or out.tobytes() != np.concatenate([_inputs(q, np.float64, 5000) for q in range(size)]).tobytes():
        bad.append(("all_gather", err))
    x = _inputs(rank, np.float64, 600 * size)
    out = np.empty_like(x)
    err = engines[0].all_to_all(out, x)
    want = np.concatenate([_inputs(q, np.float64, 600 * size)[rank * 600:(rank + 1) * 600] for q in range(size)])
    if err is not None or out.tobytes() != want.tobytes():
        bad.append(("all_to_all", err))
    x = _inputs(rank, np.float32, 100000)
    err = engines[1].broadcast(x, size - 1)
    if err is not None or x.tobytes() != _inputs(size - 1, np.float32, 100000).tobytes():
        bad.append(("broadcast", err))
    dist.barrier()
    return bad


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("n", [2, 3])
def test_results_are_numpys_bit_for_bit(n, engine):
    res = run(_bitwise, n, env=ENGINES[engine])
    assert res == [[]] * n, res


def _mixed(rank, size):
    """Calls through the table and through ndist.distributed, in another mix on every rank."""
    import ndist.distributed as dist

    h = _handle()
    eng = C.Engine(h)
    sums = []
    for k in range(8):
        x = np.full(16, float(rank + k))
        if (k + rank) % 2:
            dist.all_reduce(x)
        else:
            assert eng.all_reduce(x) is None
        sums.append(float(x[0]))
        y = np.arange(8, dtype=np.int64) * (rank + 1)
        if (k + rank) % 3:
            dist.broadcast(y, src=k % size)
        else:
            assert eng.broadcast(y, k % size) is None
        sums.append(int(y[-1]))
        via_c = (k + rank) % 2 == 0
        g_in, g_out = np.full(4, rank + k, np.int32), np.empty(4 * size, np.int32)
        if via_c:
            assert eng.all_gather(g_out, g_in) is None
        else:
            dist.all_gather_into_tensor(g_out, g_in)
        r_in, r_out = np.arange(3 * size, dtype=np.float32) + rank, np.empty(3, np.float32)
        if via_c:
            assert eng.reduce_scatter(r_out, r_in) is None
        else:
            dist.reduce_scatter_tensor(r_out, r_in)
        a_in, a_out = np.arange(2 * size, dtype=np.int64) + 100 * rank, np.empty(2 * size, np.int64)
        if not via_c:
            assert eng.all_to_all(a_out, a_in) is None
        else:
            dist.all_to_all_single(a_out, a_in)
        # split sizes: rank r sends q + r + 1 elements of 100 r + q to rank q
        isz, osz = [q + rank + 1 for q in range(size)], [rank + q + 1 for q in range(size)]
        v_in = np.concatenate([np.full(s, 100 * rank + q, np.int32) for q, s in enumerate(isz)])
        v_out = np.empty(sum(osz), np.int32)
        if (k + rank) % 3 == 1:
            assert eng.all_to_all_v(v_out, osz, v_in, isz) is None
        else:
            dist.all_to_all_single(v_out, v_in, osz, isz)
        assert v_out.tolist() == [100 * q + rank for q, s in enumerate(osz) for _ in range(s)], v_out
        sums.append((g_out.tolist(), r_out.tolist(), sorted(a_out.tolist())[:1]))
    backend = dist.group.WORLD.backend_for("cpu")
    return sums, _records(), backend._exec.seq


@pytest.mark.parametrize("engine", [*ENGINES, "detail"])
def test_calls_mix_with_ndist_distributed_in_any_order(engine):
    """(``detail``: NDIST_DEBUG=DETAIL compares every call's signature across ranks, a call
    through the table on one rank against ndist.distributed's on another)"""
    n = 3
    res = run(_mixed, n, env=ENGINES.get(engine, {"NDIST_DEBUG": "DETAIL"}))
    for rank, (sums, _, _) in enumerate(res):
        assert sums[:2] == [float(sum(range(n))), 7 * 1]
        for k in range(8):
            s_ar, s_b, (g, r, a) = sums[3 * k:3 * k + 3]
            assert s_ar == float(sum(range(n)) + n * k) and s_b == 7 * (k % n + 1)
            assert g == [q + k for q in range(n) for _ in range(4)]
            assert r == [float(sum(3 * rank + i + q for q in range(n))) for i in range(3)]
            assert a == [2 * rank]
    # numbered alike on every rank: the flight recorder's entries and the backend's sequence number
    assert all(_alike(r[1]) == _alike(res[0][1]) for r in res), [r[1] for r in res]
    assert all(r[2] == res[0][2] for r in res)
    for rank, (_, recs, _) in enumerate(res):  # the table's all_to_all_v recorded as the Python path's call
        v = sum(q + rank + 1 for q in range(n))
        assert sorted({e[3:5] for e in recs if e[1] == "all_to_all_single"}) == sorted({(2 * n, 2 * n), (v, v)})
    seqs = [e[0] for e in res[0][1]]
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) == 1 + 8 * 6, res[0][1]


# ------------------------------------------------------------------ errors
def _one_sided_bad_arguments(rank, size):
    """Rank 0 alone makes bad calls: each refused before anything is numbered or sent."""
    import ndist.distributed as dist

    eng = C.Engine(_handle())
    errs = []
    if rank == 0:
        x = np.ones(size * 4, np.float32)
        sizes = [4] * size
        errs = [eng.all_reduce(x, "SUM", dtype=99), eng.all_reduce(x, "BAND"), eng.broadcast(x, size),
                eng.all_to_all(np.empty_like(x), x, count=x.size - 1),
                eng.all_to_all_v(np.empty_like(x), sizes, x, [5, -1] + sizes[2:]),
                eng.all_to_all_v(np.empty_like(x), sizes, x, [3, 5] + sizes[2:]),
                eng.all_to_all_v(np.empty_like(x), sizes, x, [4, 3] + sizes[2:]),
                eng.all_to_all_v(np.empty_like(x), sizes, x, None)]
    y = np.full(4, float(rank))
    assert eng.all_reduce(y) is None
    dist.all_reduce(y)
    return errs, y.tolist(), _records()


def test_a_bad_argument_is_refused_before_anything_is_sent_and_the_group_goes_on():
    res = run(_one_sided_bad_arguments, 2)
    errs = res[0][0]
    assert [e[0] for e in errs] == [1] * 8 and all(e[2] == 1 for e in errs), errs  # NDIST_E_ARGUMENT, usable
    assert errs[0][3] == "ValueError" and "dtype: expected a dtype code in [1, 17]" in errs[0][4] and "99" in errs[0][4]
    assert errs[1][3] == "ValueError" and "BAND needs an integer or bool tensor" in errs[1][4], errs[1]
    assert "root: expected a group rank in [0, 2), got 2" in errs[2][4], errs[2]
    assert "count: expected a multiple of the group size 2, got 7" in errs[3][4], errs[3]
    assert "all_to_all_v: in_counts[1]: expected a count >= 0, got -1" in errs[4][4], errs[4]
    assert "all_to_all_v: out_counts[0]: expected 3 (in_counts[0], what this rank sends itself), got 4" in errs[5][4]
    assert "all_to_all_v: in_counts: counts sum to 7, but the buffer has 8 elements" in errs[6][4], errs[6]
    assert "all_to_all_v: in_counts: expected 2 counts, got a NULL pointer" in errs[7][4], errs[7]
    assert res[0][1] == res[1][1] == [2.0] * 4
    assert res[0][2] == res[1][2]  # nothing numbered for the refused calls


def _mismatched(rank, size):
    eng = C.Engine(_handle())
    x = np.ones(8, np.float32)
    err = eng.all_reduce(x) if rank == 0 else eng.broadcast(x, 0)  # (rank 1 receives: it checks in its call)
    y = np.full(4, float(rank))
    after = eng.all_reduce(y)
    return err, after, y.tolist(), _records()[-2:]


def test_a_mismatch_is_raised_on_both_ranks_and_the_group_goes_on():
    res = run(_mismatched, 2)
    for rank, (err, after, y, recs) in enumerate(res):
        assert err is not None and err[0] == 4 and err[3] == "DistMismatchError", (rank, err)  # NDIST_E_MISMATCH
        assert "collective mismatch" in err[4] and "all_reduce float32[8] SUM #2" in err[4], err
        assert "broadcast float32[8] root=0 #2" in err[4], err
        assert err[2] == 1  # one piece on both sides: the engine keeps the group
        assert after is None and y == [1.0] * 4, (rank, after, y)
        assert recs[0][-1] == "failed" and recs[1][-1] == "completed", recs


def _killed_mid_call(rank, size, folder):
    from tests.kill_sync import all_past

    eng = C.Engine(_handle())
    all_past(folder, rank, size, victim=size - 1)
    if rank == size - 1:
        time.sleep(0.5)  # the others are waiting in the all_reduce by now
        os.kill(os.getpid(), signal.SIGKILL)
    import ndist.collectives as col

    import ndist.distributed as dist

    state = dist.group.WORLD.backend_for("cpu")._exec.state  # (the C core's claim reads its flags)
    t0 = time.monotonic()
    err = eng.all_reduce(np.ones(1024, np.float32))
    took = time.monotonic() - t0
    again = eng.barrier()
    try:
        col.engine_handle()
    except Exception as exc:  # noqa: BLE001 - a revoked group: its DistRankFailureError
        return err, took, again, type(exc).__name__, state.broken
    return err, took, again, None, state.broken


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("n", [2, 3])
def test_a_peer_killed_mid_call_is_named(tmp_path, n, engine):
    res = run(_killed_mid_call, n, str(tmp_path), may_die=[n - 1], env=ENGINES[engine])
    for rank in range(n - 1):
        err, took, again, handle, broken = res[rank]
        assert broken  # (so later calls go to the Python path, which raises the first failure again)
        assert err is not None and err[0] == 2, (rank, err)  # NDIST_E_PEER_LOST
        assert err[1] == n - 1 and f"rank {n - 1}" in err[4], err
        assert err[3] in ("DistNetworkError", "DistRankFailureError") and err[2] == 0, err
        assert took < 10, took
        # later calls: the group's first failure again, or its revocation (NDIST_E_BROKEN / PEER_LOST)
        assert again is not None and again[0] in (2, 5) and again[1] == n - 1 and again[2] == 0, again
        if again[3] == "DistRankFailureError":  # revoked: a new handle is refused with the same error
            assert handle == "DistRankFailureError", handle


def _destroyed(rank, size):
    import ndist.collectives as col
    import ndist.distributed as dist

    dist.init_process_group("socket")
    try:
        col.engine_handle()
    except ValueError as err:
        before = str(err)
    h = _handle()
    same = col.engine_handle() == h
    eng = C.Engine(h)
    state = dist.group.WORLD.backend_for("cpu")._exec.state
    dist.destroy_process_group()
    return before, same, eng.barrier(), eng.all_reduce(np.ones(4)), state.closed


def test_a_handle_of_a_destroyed_group_is_closed():
    res = run(_destroyed, 2, init=False)
    for before, same, after, again, closed in res:
        assert closed  # (the C core's claim reads it: native/clane.c, LaneState)
        assert "expected a group that ran a collective on the CPU (its set-up), got one that has not" in before
        assert same
        assert after is not None and after[0] == 6 and after[3] == "DistBackendError", after  # NDIST_E_CLOSED
        assert "is closed (its group was destroyed)" in after[4], after
        assert again == after


def _refused_handle(rank, size):
    import ndist.collectives as col
    import ndist.distributed as dist

    dist.barrier()
    try:
        col.engine_handle()
    except ValueError as err:
        return str(err)
    return None


def test_a_group_off_the_native_engine_has_no_handle():
    res = run(_refused_handle, 2, env={"NDIST_ENGINE": "python"})
    for msg in res:
        assert msg is not None and "expected a group on the native engine, got one on the python engine" in msg, msg


def _late(rank, size):
    from datetime import timedelta

    import ndist.distributed as dist

    dist.init_process_group("socket", timeout=timedelta(seconds=2))
    eng = C.Engine(_handle())
    if rank == 1:
        time.sleep(4)  # rank 0's call times out waiting for this rank's data
    x = np.full(8, float(rank + 1))
    err = eng.all_reduce(x)
    y = np.full(8, float(rank + 1))
    after = eng.all_reduce(y)
    dist.destroy_process_group()
    return err, x.tolist(), after, y.tolist()


def test_a_late_peer_is_a_timeout_naming_it_and_the_group_goes_on():
    (err, _, after0, y0), (err1, x1, after1, y1) = run(_late, 2, init=False)
    assert err is not None and err[0] == 3 and err[3] == "DistTimeoutError" and err[1] == -1, err  # NDIST_E_TIMEOUT
    assert "timed out; ranks not heard from: [1]" in err[4], err
    assert err[2] == 1  # one piece, this rank's data posted: the late peer finishes the op once it comes
    assert err1 is None and x1 == [3.0] * 8, (err1, x1)
    assert after0 is None and after1 is None and y0 == y1 == [3.0] * 8


def _behind_queued_work(rank, size):
    """A call through the table while async ops are queued on the group's executor: it waits
    for them (the lane is claimed after them), as a blocking call through ndist.distributed
    does, on every rank."""
    import ndist.distributed as dist

    eng = C.Engine(_handle())
    works = []
    xs = []
    for k in range(4):
        x = np.full(1 << 16, float(rank + k))
        xs.append(x)
        works.append(dist.all_reduce(x, async_op=True))
    y = np.full(8, float(rank))
    err = eng.all_reduce(y)
    done = [w.is_completed() for w in works]
    for w in works:
        w.wait()
    return err, y.tolist(), done, [float(x[0]) for x in xs], [e[1] for e in _records()[-5:]]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_call_waits_for_the_groups_queued_async_ops(engine):
    n = 2
    res = run(_behind_queued_work, n, env=ENGINES[engine])
    for err, y, done, xs, ops in res:
        assert err is None and y == [1.0] * 8, (err, y)
        assert done == [True] * 4, done  # the async ops ran first
        assert xs == [1.0, 3.0, 5.0, 7.0], xs
        assert ops == ["all_reduce"] * 5


def _interrupted(rank, size):
    """Rank 0's main thread waits in a call through the table; a SIGINT's handler raises there."""
    import threading

    eng = C.Engine(_handle())
    if rank == 0:
        # the rank gets SIGINT as a Python program started from a terminal does (its handler
        # raising KeyboardInterrupt, the signal not blocked), whatever the process that started
        # it left: an ignored disposition or a blocked mask survives exec (seen as a missed
        # signal in CI's full run only); what it inherited is kept for the assertion's message
        inherited = (signal.getsignal(signal.SIGINT), signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        err = eng.all_reduce(np.ones(8))  # rank 1 does not come before the signal
        return err, time.monotonic() - t0, eng.barrier(), repr(inherited)
    time.sleep(2)
    return None


def test_a_signal_on_the_main_thread_interrupts_a_call():
    (err, took, again, inherited), _ = run(_interrupted, 2)
    assert err is not None and err[0] == 7 and err[3] == "KeyboardInterrupt" and err[2] == 0, (err, inherited)
    assert took < 5, took
    assert again is not None and again[0] == 5, again  # the interrupt broke the group: NDIST_E_BROKEN


# ------------------------------------------------------------------ the C core
def _python_calls_per_table_call(rank, size):
    """The ndist functions a call through the table runs on this thread (``sys.setprofile``),
    after a first call (a dtype's first sight asks ``describe`` once): every function of the
    table on the group's C core, then calls the core does not take (AVG on float16, finished by
    NumPy; a zero count), which go through ``_capi.py``'s hooks."""
    import sys as _sys

    import ndist

    package = os.path.dirname(ndist.__file__) + os.sep
    eng = C.Engine(_handle(), gil=True)  # (the caller's thread holds the GIL: its profile hook sees any frame)
    calls: list = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(package):
            calls.append(frame.f_code.co_name)

    def seen(fn):
        assert fn() is None
        calls.clear()
        _sys.setprofile(profile)
        try:
            errs = [fn() for _ in range(3)]
        finally:
            _sys.setprofile(None)
        assert errs == [None] * 3, errs
        return sorted(set(calls))

    x = np.arange(1024, dtype=np.float32) + rank
    i64 = np.arange(8, dtype=np.int64) * (rank + 1)
    g_in, g_out = np.full(4, rank, np.int32), np.empty(4 * size, np.int32)
    r_in, r_out = np.arange(3 * size, dtype=np.float64) + rank, np.empty(3, np.float64)
    a_in, a_out = np.arange(2 * size, dtype=np.int64), np.empty(2 * size, np.int64)
    v_counts = [rank + 1 + q for q in range(size)]  # (rank r and q exchange r + 1 + q elements each way)
    v_in, v_out = np.arange(sum(v_counts), dtype=np.int64), np.empty(sum(v_counts), np.int64)
    core = {
        "all_reduce": seen(lambda: eng.all_reduce(x)),
        "all_reduce AVG int64": seen(lambda: eng.all_reduce(i64, "AVG")),
        "broadcast": seen(lambda: eng.broadcast(i64, size - 1)),
        "all_gather": seen(lambda: eng.all_gather(g_out, g_in)),
        "reduce_scatter MAX": seen(lambda: eng.reduce_scatter(r_out, r_in, "MAX")),
        "all_to_all": seen(lambda: eng.all_to_all(a_out, a_in)),
        "all_to_all_v": seen(lambda: eng.all_to_all_v(v_out, v_counts, v_in, v_counts)),
        "barrier": seen(eng.barrier),
    }
    h16 = np.ones(8, np.float16)
    hooks = {
        "all_reduce AVG float16": seen(lambda: eng.all_reduce(h16, "AVG")),
        "all_reduce of 0": seen(lambda: eng.all_reduce(x[:0])),
    }
    return core, hooks, h16.tolist(), _records()[-3:]


#: two simulated hosts of 2 ranks (the two-level group, ``ctwo.c``), every call in two levels (below
#: the minimum, direct on the whole TCP group, FastLane's test runs it too:
#: ``test_socket_lane.py``'s ``test_a_blocking_call_on_a_two_level_group_is_one_c_call``)
TWO_LEVELS = {"two": {"NDIST_NATIVE_HOSTS": "2", "NDIST_NATIVE_TWO_LEVEL_MIN": "0"}}


@pytest.mark.parametrize("engine,n", [(e, 2) for e in ENGINES] + [(e, 4) for e in TWO_LEVELS])
def test_a_call_the_c_core_takes_runs_no_python(engine, n):
    """A call through the table on a native group (one level or two) runs its bookkeeping in C
    (the group's C core, ``clane.c``, as FastLane's methods do): no Python frame on success.
    What the core does not finish goes through the Python hooks (``begin`` / ``end``), numbered
    and recorded alike."""
    res = run(_python_calls_per_table_call, n, env={**ENGINES, **TWO_LEVELS}[engine])
    for core, hooks, h16, recs in res:
        assert core == {k: [] for k in core}, core
        assert {k: "begin" in v and "end" in v for k, v in hooks.items()} == {k: True for k in hooks}, hooks
        assert h16 == [1.0] * 8
        assert [r[1:] for r in recs] == [("all_reduce", "float32", 0, 0, None, "completed")] * 3, recs
    assert all(r[3] == res[0][3] for r in res)
