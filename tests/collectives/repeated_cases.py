"""A call repeated with the same buffer objects is checked like the first one.

The public layer keeps the repeated call cheap (docs/architecture.md, "The
repeated call"); nothing it keeps may outlive what it was derived from. Each
case first runs valid calls on some buffers, then changes those same objects
in place (flags, shape, dtype, the array behind a Tensor) or passes them in a
new combination, and expects what a first call with them gives: the same
error before anything is sent, or the right result. Run on every rank of a
2-rank job; a valid all_reduce follows each case.
"""

from __future__ import annotations

import re
import traceback

import numpy as np

from tests.collectives.collective_launch import usable_after

CASES: list = []


def case(fn):
    CASES.append(fn)
    return fn


def _raises(exc: type, pattern: str, fn, *args, **kwargs) -> None:
    try:
        fn(*args, **kwargs)
    except exc as err:
        if not re.search(pattern, str(err)):
            raise AssertionError(f"message {str(err)!r} does not match {pattern!r}") from None
    else:
        raise AssertionError(f"did not raise {exc.__name__}")


def _warm(fn, *args, **kwargs) -> None:
    for _ in range(3):
        fn(*args, **kwargs)


@case
def read_only_after_writable(d, r, n):
    a = np.ones(8, np.float32)
    _warm(d.all_reduce, a)
    a.flags.writeable = False
    _raises(ValueError, r"tensor: expected a writable tensor", d.all_reduce, a)
    out, inp = np.zeros(8, np.float32), np.ones(8 * n, np.float32)
    _warm(d.reduce_scatter_tensor, out, inp)
    out.flags.writeable = False
    _raises(ValueError, r"output: expected a writable tensor", d.reduce_scatter_tensor, out, inp)
    out = np.zeros(8 * n, np.float32)
    _warm(d.all_to_all_single, out, inp)
    out.flags.writeable = False
    _raises(ValueError, r"output: expected a writable tensor", d.all_to_all_single, out, inp)


@case
def dtype_changed_in_place(d, r, n):
    a = np.full(8, r + 1, np.float32)
    _warm(d.all_reduce, a)
    a.dtype = "S4"  # the same object, now of bytes
    _raises(TypeError, r"tensor: expected a tensor of a bool, integer, floating-point or complex dtype, got dtype \|S4",
            d.all_reduce, a)
    b = np.full(4, r + 1, np.float64)
    _warm(d.all_reduce, b)
    b.dtype = np.int32  # 8 elements now
    b[:] = r + 1
    d.all_reduce(b)
    assert b.shape == (8,) and (b == n * (n + 1) // 2).all(), b
    out, inp = np.zeros(4 * n, np.float32), np.ones(4, np.float32)
    _warm(d.all_gather_into_tensor, out, inp)
    inp.dtype = np.float16  # 8 elements, another dtype than out's
    _raises(TypeError, r"input_tensor: expected dtype float32 \(the dtype of output_tensor\), got float16",
            d.all_gather_into_tensor, out, inp)


@case
def shape_changed_in_place(d, r, n):
    out, inp = np.zeros(4 * n, np.int64), np.arange(4 * n, dtype=np.int64)
    _warm(d.all_to_all_single, out, inp)
    out.shape, inp.shape = (2 * n, 2), (n, 4)
    _raises(ValueError, r"output: expected trailing dimensions \(4,\) \(those of input\), got shape", d.all_to_all_single,
            out, inp)
    out.shape = (n, 4)
    inp[:] = r * 100 + np.arange(4 * n).reshape(n, 4)
    d.all_to_all_single(out, inp)
    want = np.stack([p * 100 + np.arange(4 * n).reshape(n, 4)[r] for p in range(n)])
    assert (out == want).all(), (out, want)
    small = np.ones(4, np.float32)
    big = np.zeros(4 * n, np.float32)
    _warm(d.all_gather_into_tensor, big, small)
    small.shape = (2, 2)  # same size, other shape: still fine (flattened)
    d.all_gather_into_tensor(big, small)
    big.shape = (2 * n, 2)
    d.all_gather_into_tensor(big, small)
    assert (big == 1).all()


@case
def aliased_after_distinct(d, r, n):
    out, inp = np.zeros(2 * n, np.int32), np.zeros(2 * n, np.int32)
    _warm(d.all_to_all_single, out, inp)
    out[:] = r * 10 + np.arange(2 * n)
    d.all_to_all_single(out, out)  # in place: the input is copied first
    want = np.concatenate([p * 10 + np.arange(2 * r, 2 * r + 2) for p in range(n)])
    assert (out == want).all(), (out, want)
    big = np.zeros(2 * n, np.int32)
    _warm(d.all_gather_into_tensor, big, np.ones(2, np.int32))
    big[:] = -1
    big[2 * r:2 * r + 2] = r + 5
    d.all_gather_into_tensor(big, big[2 * r:2 * r + 2])  # input inside the output
    assert (big == np.repeat(np.arange(n) + 5, 2)).all(), big


@case
def staged_after_contiguous(d, r, n):
    base = np.full((8, 2), r + 1, np.float64)
    _warm(d.all_reduce, base[:, 0].copy())
    col = base[:, 0]  # not contiguous: staged and written back
    d.all_reduce(col)
    assert (base[:, 0] == n * (n + 1) / 2).all() and (base[:, 1] == r + 1).all(), base
    out, inp = np.zeros((4 * n, 2), np.float64), np.ones(4, np.float64)
    _warm(d.all_gather_into_tensor, out[:, 0].copy(), inp)
    d.all_gather_into_tensor(out[:, 0], inp)
    assert (out[:, 0] == 1).all() and (out[:, 1] == 0).all(), out


@case
def arguments_changed(d, r, n):
    a = np.ones(8, np.float32)
    _warm(d.all_reduce, a)
    _raises(ValueError, r"op: BAND needs an integer or bool tensor, got dtype float32", d.all_reduce, a,
            op=d.ReduceOp.BAND)
    _raises(TypeError, r"async_op: expected a bool, got str", d.all_reduce, a, async_op="yes")
    _raises(TypeError, r"op: expected a ndist.distributed.ReduceOp, got str", d.all_reduce, a, op="sum")
    _warm(d.broadcast, a, 0)
    _raises(ValueError, r"src: expected a global rank in group \[0, 1\], got 7", d.broadcast, a, 7)
    _raises(TypeError, r"group: expected a ProcessGroup", d.broadcast, a, 0, group="world")
    _warm(d.barrier)
    _raises(TypeError, r"device_ids: expected a list of ints or None, got int", d.barrier, device_ids=0)
    _raises(TypeError, r"async_op: expected a bool, got str", d.barrier, async_op="yes")
    _raises(TypeError, r"group: expected a ProcessGroup", d.barrier, group="world")
    out, inp = np.zeros(8 * n, np.float32), np.ones(8, np.float32)
    _warm(d.all_gather_into_tensor, out, inp)
    _raises(ValueError, r"output_tensor: expected \d+ elements", d.all_gather_into_tensor, out[:-1], inp)
    _raises(TypeError, r"input_tensor: expected dtype float32 \(the dtype of output_tensor\), got float64",
            d.all_gather_into_tensor, out, inp.astype(np.float64))


@case
def tensor_over_another_array(d, r, n):
    import ndist

    t = ndist.ones(8)
    _warm(d.all_reduce, t)
    t._data = np.ones(8, np.float32)
    t._data.flags.writeable = False
    _raises(ValueError, r"tensor: expected a writable tensor", d.all_reduce, t)
    t._data = np.full(8, float(r + 1), np.float32)
    d.all_reduce(t)
    assert (t.numpy() == n * (n + 1) / 2).all()


@case
def destroyed_group(d, r, n):
    g = d.new_group(list(range(n)))
    a = np.ones(4, np.float32)
    _warm(d.all_reduce, a, group=g)
    d.destroy_process_group(g)
    _raises(ValueError, r"destroyed", d.all_reduce, a, group=g)


@case
def every_repeat_is_recorded(d, r, n):
    g = d.new_group(list(range(n)))
    a, out = np.ones(4, np.float32), np.zeros(4 * n, np.float32)
    for _ in range(5):
        d.all_reduce(a, group=g)
        d.all_gather_into_tensor(out, a, group=g)
    d.broadcast(a, 0, group=g)
    entries = d.flight_recorder(g)
    got = [(e["seq"], e["op"], e["dtype"], e["count_in"], e["count_out"], e["root"], e["state"]) for e in entries]
    want = []
    for i in range(5):
        want.append((2 * i + 1, "all_reduce", "float32", 4, 4, None, "completed"))
        want.append((2 * i + 2, "all_gather_into", "float32", 4, 4 * n, None, "completed"))
    want.append((11, "broadcast", "float32", 4, 4, 0, "completed"))
    assert got == want, got
    assert all(e["time_done"] >= e["time_issued"] for e in entries)
    d.destroy_process_group(g)


@case
def every_reduce_op(d, r, n):
    R = d.ReduceOp
    ints = {R.SUM: n * (n + 1) // 2, R.PRODUCT: 1, R.MIN: 1, R.MAX: n, R.BAND: 0, R.BOR: 0, R.BXOR: 0}
    for op, want in ints.items():
        a = np.full(4, r + 1, np.int32)
        _warm(d.all_reduce, np.ones(4, np.int32))
        if op is R.PRODUCT:
            for p in range(1, n + 1):
                want *= p
        if op in (R.BAND, R.BOR, R.BXOR):
            want = 1
            for p in range(2, n + 1):
                want = want & p if op is R.BAND else want | p if op is R.BOR else want ^ p
        d.all_reduce(a, op=op)
        assert (a == want).all(), (op, a, want)
        out, inp = np.zeros(2, np.int32), np.full(2 * n, r + 1, np.int32)
        _warm(d.reduce_scatter_tensor, out, np.ones(2 * n, np.int32))
        d.reduce_scatter_tensor(out, inp, op=op)
        assert (out == want).all(), (op, out, want)
    f = np.full(4, float(r + 1), np.float32)
    d.all_reduce(f, op=R.AVG)
    assert (f == (n + 1) / 2).all(), f
    f[:] = r + 1
    d.all_reduce(f, op=d._make_nccl_premul_sum(2.0))
    assert (f == n * (n + 1)).all(), f


@case
def read_only_buffers(d, r, n):
    a = np.full(4, float(r), np.float64)
    _warm(d.broadcast, a, 0)
    a.flags.writeable = False
    if r != 0:
        _raises(ValueError, r"tensor: expected a writable tensor", d.broadcast, a, 0)
    b = np.full(4, float(r), np.float64)
    b.flags.writeable = r != 0
    d.broadcast(b, 0)  # read-only on the root is fine
    assert (b == 0).all(), b
    out, inp = np.zeros(4 * n, np.float32), np.ones(4, np.float32)
    _warm(d.all_gather_into_tensor, out, inp)
    out.flags.writeable = False
    _raises(ValueError, r"output_tensor: expected a writable tensor", d.all_gather_into_tensor, out, inp)


@case
def async_after_sync(d, r, n):
    a = np.full(4, float(r + 1), np.float32)
    out, part = np.zeros(4 * n, np.float32), np.full(4, float(r), np.float32)
    _warm(d.all_reduce, np.ones(4, np.float32))
    _warm(d.all_gather_into_tensor, out, part)
    _warm(d.reduce_scatter_tensor, part, out)
    _warm(d.all_to_all_single, out, out.copy())
    _warm(d.broadcast, a, 0)
    a[:] = r + 1
    works = [d.all_reduce(a, async_op=True)]
    assert works[0] is not None and works[0].wait(), works
    assert (a == n * (n + 1) / 2).all(), a
    part[:] = r
    for w in (d.all_gather_into_tensor(out, part, async_op=True), d.broadcast(a, 0, async_op=True),
              d.reduce_scatter_tensor(part, out.copy(), async_op=True),
              d.all_to_all_single(out, out.copy(), async_op=True)):
        assert w is not None, "async_op=True returned None"
        w.wait()


@case
def subgroups_of_one(d, r, n):
    groups = [d.new_group([p]) for p in range(n)]
    mine, other = groups[r], groups[(r + 1) % n]
    a = np.full(4, float(r + 1), np.float32)
    out, inp = np.zeros(4, np.float32), np.full(4, float(r), np.float32)
    for _ in range(3):
        d.all_reduce(a, group=mine)
        d.broadcast(a, r, group=mine)
        d.all_gather_into_tensor(out, inp, group=mine)
        d.reduce_scatter_tensor(out, inp, group=mine)
        d.all_to_all_single(out, inp, group=mine)
        if n > 1:
            assert d.all_reduce(a, group=other) is None  # not a member: nothing happens
            assert d.broadcast(a, (r + 1) % n, group=other) is None
    assert (a == r + 1).all() and (out == r).all(), (a, out)
    assert [e["root"] for e in d.flight_recorder(mine) if e["op"] == "broadcast"] == [0, 0, 0]
    if n > 1:
        assert d.flight_recorder(other) == []
        _raises(ValueError, rf"src: expected a global rank in group \[{r}\], got {(r + 1) % n}", d.broadcast, a,
                (r + 1) % n, group=mine)
        _raises(ValueError, r"output_tensor: expected 4 elements", d.all_gather_into_tensor, np.zeros(4 * n, np.float32),
                inp, group=mine)
        _raises(ValueError, r"input: expected 4 elements", d.reduce_scatter_tensor, out, np.zeros(4 * n, np.float32),
                group=mine)
        _raises(ValueError, r"output_split_sizes: not given, so dim 0 of output \(3\)", d.all_to_all_single,
                np.zeros(3, np.float32), np.zeros(3, np.float32), group=groups[0] if n == 1 else d.group.WORLD)
    for g in groups:
        d.destroy_process_group(g)


@case
def reduce_scatter_into_its_input(d, r, n):
    inp = np.zeros(4 * n, np.float64)
    _warm(d.reduce_scatter_tensor, np.zeros(4, np.float64), inp)
    inp[:] = r + 1
    out = inp[4 * r:4 * r + 4]  # the output is this rank's chunk of the input
    d.reduce_scatter_tensor(out, inp)
    assert (out == n * (n + 1) / 2).all(), out


def _uneven(r, n):
    """Split sizes where rank r sends j + 1 rows to rank j (rows of 2): sizes, input, expected output."""
    isz = [j + 1 for j in range(n)]
    osz = [r + 1] * n
    inp = np.concatenate([np.full((j + 1, 2), 10 * r + j, np.int32) for j in range(n)])
    want = np.concatenate([np.full((r + 1, 2), 10 * j + r, np.int32) for j in range(n)])
    return osz, isz, inp, want


@case
def uneven_splits_changed(d, r, n):
    osz, isz, inp, want = _uneven(r, n)
    out = np.zeros_like(want)
    for _ in range(3):
        out[:] = 0
        d.all_to_all_single(out, inp, osz, isz)
        assert np.array_equal(out, want), out
    out[:] = 0
    d.all_to_all_single(out, inp, tuple(osz), [np.int64(s) for s in isz])  # tuple, NumPy ints: general path
    assert np.array_equal(out, want), out
    _raises(ValueError, r"input_split_sizes: sizes \[.*\] sum to", d.all_to_all_single, out, inp, osz,
            isz[:-1] + [isz[-1] + 1])
    _raises(ValueError, r"input_split_sizes\[0\]: expected a size >= 0, got -1", d.all_to_all_single, out, inp,
            osz, [-1] + isz[1:])
    _raises(TypeError, r"input_split_sizes\[0\]: expected an int, got bool", d.all_to_all_single, out, inp, osz,
            [True] + isz[1:])
    _raises(ValueError, rf"input_split_sizes: expected {n} sizes \(the group size\)", d.all_to_all_single, out,
            inp, osz, isz + [0])
    me_in = list(isz)  # what this rank sends itself differs from what it receives from itself
    me_in[r] += 1
    me_in[(r + 1) % n] -= 1
    _raises(ValueError, rf"output_split_sizes\[{r}\]: expected {me_in[r]}", d.all_to_all_single, out, inp, osz,
            me_in)
    _raises(ValueError, r"output: expected trailing dimensions \(2,\)", d.all_to_all_single,
            np.zeros((want.size,), np.int32), inp, [s * 2 for s in osz], isz)
    sizes = list(isz)  # the caller's list changed in place between calls: nothing is remembered
    d.all_to_all_single(out, inp, osz, sizes)
    sizes[0] += 1
    _raises(ValueError, r"input_split_sizes: sizes", d.all_to_all_single, out, inp, osz, sizes)


@case
def recorded_as_the_general_path_records(d, r, n):
    g = d.new_group(list(range(n)))
    a, part, full = np.ones(4, np.float32), np.ones(4, np.int16), np.ones(4 * n, np.int16)
    calls = [lambda **k: d.all_reduce(a, op=d.ReduceOp.MAX, group=g, **k),
             lambda **k: d.broadcast(a, n - 1, group=g, **k),
             lambda **k: d.all_gather_into_tensor(full, part, group=g, **k),
             lambda **k: d.reduce_scatter_tensor(part, full, group=g, **k),
             lambda **k: d.all_to_all_single(full, full.copy(), group=g, **k),
             lambda **k: d.all_to_all_single(full, full.copy(), [4] * n, [4] * n, group=g, **k),
             lambda **k: d.barrier(group=g, **k)]
    for call in calls:
        _warm(call)  # the last two are repeated calls
        call(async_op=True).wait()  # the general path
    keys = ("op", "device", "dtype", "count_in", "count_out", "root", "state", "error")
    entries = [tuple(e[k] for k in keys) for e in d.flight_recorder(g)]
    assert [e["seq"] for e in d.flight_recorder(g)] == list(range(1, 4 * len(calls) + 1)), d.flight_recorder(g)
    for i in range(len(calls)):
        plain, general = entries[4 * i + 2], entries[4 * i + 3]
        assert plain == general, (plain, general)
    d.destroy_process_group(g)


def run_cases(dist) -> dict:
    """``{case name: None or what went wrong}``, on this rank."""
    rank, size = dist.get_rank(), dist.get_world_size()
    results = {}
    for fn in CASES:
        try:
            fn(dist, rank, size)
            problem = None
        except Exception:  # noqa: BLE001
            problem = traceback.format_exc()
        results[fn.__name__] = usable_after(dist, problem)
    return results


def entry(rank=None, world_size=None, device="cpu") -> dict:
    import ndist.distributed as dist

    return run_cases(dist)
