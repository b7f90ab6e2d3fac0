"""The collectives conformance checks, written once for every backend.

``run_all(dist)`` runs inside every rank of one launch (``ndist.testing.run_ranks``
for the socket backends, ``mpiexec`` for mpi) with the default group already
initialised, and returns ``{combo: failure-or-None}`` where a combo is
``"<dtype>-<lib>"`` (or ``"misc"``). Every rank runs the same sequence of
collectives; expected values come from a NumPy oracle that regenerates every
rank's input locally. ``combos(size)`` lists the combos without running them,
so the pytest side can parametrize over them.
"""

from __future__ import annotations

import importlib.util
import traceback

import numpy as np

# The tensor core's dtypes; bfloat16 exists only where ml_dtypes is installed (as in ndist.tensor).
DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64",
          "complex64", "complex128"] + (["bfloat16"] if importlib.util.find_spec("ml_dtypes") else [])
LIBS = ["tensor", "numpy"]

_CASES: list = []
_MISC: list = []


def case(fn):
    _CASES.append(fn)
    return fn


def combos() -> list[str]:
    return [f"{d}-{lib}" for d in DTYPES for lib in LIBS] + ["misc"]


def np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


# ---------------------------------------------------------------- data + oracle
class Ctx:
    """One (dtype, library, device) combination: inputs, buffers, the oracle and the comparison.

    Buffers (``buf``, ``empty``) live on ``device``: NumPy arrays on "cpu", CuPy arrays on
    "cuda" (a GPU backend's entry); ``vals`` is always the NumPy oracle's copy.
    """

    def __init__(self, dist, dtype: str, lib: str, device: str = "cpu"):
        self.dist = dist
        self.device = device
        if device == "cuda":
            import cupy

            self.xp = cupy
        else:
            self.xp = np
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()
        self.dtype_name = dtype
        self.dtype = np_dtype(dtype)
        self.lib = lib

    @property
    def kind(self) -> str:
        return "f" if self.dtype_name == "bfloat16" else self.dtype.kind

    def vals(self, shape, rank=None, salt=0) -> np.ndarray:
        """Deterministic small values (exact in every dtype) of ``rank``'s input."""
        rank = self.rank if rank is None else rank
        n = int(np.prod(shape))
        base = (np.arange(n) * 7 + rank * 3 + salt * 5) % 4
        if self.kind == "b":
            arr = base % 2 == 1
        elif self.kind == "c":
            arr = base + 1j * ((base + rank + 1) % 3)
        else:
            arr = base
        return np.asarray(arr).astype(self.dtype).reshape(shape)

    def buf(self, shape, rank=None, salt=0):
        """``vals`` on this combination's device."""
        arr = self.vals(shape, rank, salt)
        return arr if self.xp is np else self.xp.asarray(arr)

    def wrap(self, arr):
        if self.lib == "tensor":
            from ndist.tensor import Tensor

            return Tensor._wrap(arr)
        return arr

    @staticmethod
    def data(t):
        """A NumPy copy or view of ``t`` (Tensor, NumPy or CuPy) for the comparison."""
        arr = t if isinstance(t, np.ndarray) else getattr(t, "_data", t)
        return arr if isinstance(arr, np.ndarray) else arr.get()

    def empty(self, shape):
        return self.xp.zeros(shape, self.dtype)

    def ops(self):
        R = self.dist.ReduceOp
        if self.kind == "b":
            return [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR]
        if self.kind in "iu":
            return [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR, R.AVG]
        if self.kind == "c":
            return [R.SUM, R.PRODUCT, R.AVG, "premul"]
        return [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.AVG, "premul"]

    def op(self, op):
        return self.dist._make_nccl_premul_sum(0.5) if op == "premul" else op

    def reduce(self, arrays, op):
        """NumPy oracle: reduce ``arrays`` (one per rank) with ``op``."""
        R = self.dist.ReduceOp
        if self.kind == "b":
            stack = np.stack(arrays)
            fn = {R.SUM: np.any, R.MAX: np.any, R.BOR: np.any, R.PRODUCT: np.all, R.MIN: np.all,
                  R.BAND: np.all, R.BXOR: lambda s, axis: np.logical_xor.reduce(s, axis=axis)}[op]
            return fn(stack, axis=0)
        wide = np.complex128 if self.kind == "c" else (np.int64 if self.kind in "iu" else np.float64)
        stack = np.stack([a.astype(wide) for a in arrays])
        if op == R.AVG and self.kind in "iu":
            return int_avg(stack, self.dtype)
        if op == "premul":
            return (stack * 0.5).sum(0)
        fn = {R.SUM: lambda s: s.sum(0), R.PRODUCT: lambda s: s.prod(0), R.MIN: lambda s: s.min(0),
              R.MAX: lambda s: s.max(0), R.AVG: lambda s: s.mean(0),
              R.BAND: lambda s: np.bitwise_and.reduce(s, 0), R.BOR: lambda s: np.bitwise_or.reduce(s, 0),
              R.BXOR: lambda s: np.bitwise_xor.reduce(s, 0)}[op]
        return fn(stack)

    def check(self, got, want, what: str) -> None:
        got = self.data(got)
        want = np.asarray(want)
        assert got.shape == want.shape, f"{what}: shape {got.shape} != expected {want.shape}"
        if self.kind in "biu":
            np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=what)
            return
        wide = np.complex128 if self.kind == "c" else np.float64
        rtol = {2: 1e-2, 4: 1e-5, 8: 1e-5, 16: 1e-12}[self.dtype.itemsize] if self.kind != "c" else \
            {8: 1e-5, 16: 1e-12}[self.dtype.itemsize]
        if self.dtype_name == "bfloat16":
            rtol = 2e-2
        np.testing.assert_allclose(got.astype(wide), want.astype(wide), rtol=rtol, atol=rtol, err_msg=what)


def int_avg(stack: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """AVG's oracle on integers: the sum wrapped into ``dtype`` (as SUM), divided toward zero.

    ``stack`` holds each rank's values as int64 (a uint64 one wrapped); the int64 sum wraps
    modulo 2**64, so cast to ``dtype`` it is the dtype's own wrapped sum. The division is
    done on Python ints, exactly.
    """
    n = stack.shape[0]
    summed = stack.sum(0).astype(dtype)
    q = [abs(int(v)) // n * (-1 if int(v) < 0 else 1) for v in summed.ravel()]
    return np.array(q, dtype=object).reshape(summed.shape).astype(dtype)


def entry(rank=None, world_size=None, device="cpu") -> dict:
    """What each rank runs (the default group is initialised by the launcher)."""
    import ndist.distributed as dist

    return run_all(dist, device)


def run_all(dist, device: str = "cpu") -> dict:
    """Run every check with tensors on ``device``; ``{combo: None or the failures' tracebacks}``."""
    results = {}
    for dtype in DTYPES:
        for lib in LIBS:
            ctx = Ctx(dist, dtype, lib, device)
            failures = []
            for fn in _CASES:
                try:
                    fn(ctx)
                except Exception:  # noqa: BLE001 - collected and reported by the test
                    failures.append(f"{fn.__name__}: {traceback.format_exc()}")
            results[f"{dtype}-{lib}"] = "\n".join(failures) or None
    failures = []
    for fn in _MISC:
        try:
            fn(dist)
        except Exception:  # noqa: BLE001
            failures.append(f"{fn.__name__}: {traceback.format_exc()}")
    results["misc"] = "\n".join(failures) or None
    return results


# ------------------------------------------------------------------ reductions
@case
def all_reduce_every_op(c: Ctx):
    for op in c.ops():
        t = c.buf((2, 3))
        w = c.wrap(t)
        assert c.dist.all_reduce(w, c.op(op)) is None
        c.check(w, c.reduce([c.vals((2, 3), r) for r in range(c.size)], op), f"all_reduce {op}")


@case
def all_reduce_async_empty_noncontiguous(c: Ctx):
    R = c.dist.ReduceOp
    t = c.buf((4,))
    work = c.dist.all_reduce(c.wrap(t), R.MAX if c.kind != "c" else R.SUM, async_op=True)
    work.wait()
    assert work.is_completed() and work.is_success()
    op = R.MAX if c.kind != "c" else R.SUM
    c.check(t, c.reduce([c.vals((4,), r) for r in range(c.size)], op), "async all_reduce")
    e = c.empty((0, 3))
    c.dist.all_reduce(c.wrap(e))
    assert e.shape == (0, 3)
    base = c.xp.stack([c.buf((3, 2)), c.buf((3, 2), salt=9)], axis=-1)  # (3, 2, 2)
    view = base[..., 0]  # non-contiguous
    c.dist.all_reduce(c.wrap(view), R.SUM)
    c.check(base[..., 0], c.reduce([c.vals((3, 2), r) for r in range(c.size)], R.SUM), "strided all_reduce")
    c.check(base[..., 1], c.vals((3, 2), salt=9), "strided all_reduce neighbour")


@case
def reduce_to_last_rank(c: Ctx):
    dst = c.size - 1
    for op in c.ops()[:2] + ["premul"] if c.kind in "fc" else c.ops()[:2]:
        t = c.buf((5,))
        if c.rank % 2:
            c.dist.reduce(c.wrap(t), dst, c.op(op))
        else:
            c.dist.reduce(c.wrap(t), op=c.op(op), group_dst=dst)
        want = c.reduce([c.vals((5,), r) for r in range(c.size)], op) if c.rank == dst else c.vals((5,))
        c.check(t, want, f"reduce {op}")


@case
def reduce_scatter_list_uneven(c: Ctx):
    op = c.ops()[0]
    ins = [c.buf((i + 1,), salt=i) for i in range(c.size)]
    out = c.empty((c.rank + 1,))
    c.dist.reduce_scatter(c.wrap(out), [c.wrap(a) for a in ins], op)
    c.check(out, c.reduce([c.vals((c.rank + 1,), r, salt=c.rank) for r in range(c.size)], op), "reduce_scatter")


@case
def reduce_scatter_tensor_chunks(c: Ctx):
    R = c.dist.ReduceOp
    op = R.AVG if c.kind in "fc" else R.MAX
    inp = c.buf((c.size * 3, 2))
    out = c.empty((3, 2))
    work = c.dist.reduce_scatter_tensor(c.wrap(out), c.wrap(inp), op, async_op=True)
    work.wait()
    full = c.reduce([c.vals((c.size * 3, 2), r) for r in range(c.size)], op)
    c.check(out, full[c.rank * 3:(c.rank + 1) * 3], "reduce_scatter_tensor")


@case
def avg_on_integers_truncates_the_wrapped_sum(c: Ctx):
    """AVG on an integer dtype: the sum SUM gives (wrapping), divided by the group size toward
    zero (NCCL's ncclAvg), on every reducing collective; on bool a ValueError before any byte."""
    R = c.dist.ReduceOp
    if c.kind == "b":
        try:
            c.dist.all_reduce(c.wrap(c.buf((3,))), R.AVG)
        except ValueError as err:
            assert "op: AVG needs an integer, floating-point or complex tensor, got dtype bool" in str(err), err
        else:
            raise AssertionError("AVG on bool was accepted")
        return
    if c.kind not in "iu":
        return
    info = np.iinfo(c.dtype)

    def mine(rank, n):
        # near the top (the sum wraps past max), near the bottom (past min for signed
        # dtypes), sums that leave a remainder and, for signed dtypes, negative ones
        # (toward zero, not toward minus infinity)
        edge = [int(info.max) - rank, int(info.min) + rank, 2 * rank + 1, 3 + rank]
        if c.kind == "i":
            edge += [-1 - rank, -2 * rank - 1, rank - 1, -(rank % 2) * 5]
        vals = (edge * (n // len(edge) + 1))[:n]
        return np.array(vals, dtype=object).astype(c.dtype)

    def on_device(arr):
        return arr if c.xp is np else c.xp.asarray(arr)

    n = 16
    want = int_avg(np.stack([mine(r, n).astype(np.int64) for r in range(c.size)]), c.dtype)
    t = on_device(mine(c.rank, n))
    c.dist.all_reduce(c.wrap(t), R.AVG)
    c.check(t, want, "all_reduce AVG")
    t = on_device(mine(c.rank, n))
    work = c.dist.all_reduce(c.wrap(t), R.AVG, async_op=True)
    work.wait()
    c.check(t, want, "async all_reduce AVG")
    dst = c.size - 1
    t = on_device(mine(c.rank, n))
    c.dist.reduce(c.wrap(t), dst, R.AVG)
    c.check(t, want if c.rank == dst else mine(c.rank, n), "reduce AVG")
    per = n // c.size if n % c.size == 0 else 2
    rows = per * c.size
    full = int_avg(np.stack([mine(r, rows).astype(np.int64) for r in range(c.size)]), c.dtype)
    out = c.empty((per,))
    c.dist.reduce_scatter_tensor(c.wrap(out), c.wrap(on_device(mine(c.rank, rows))), R.AVG)
    c.check(out, full[c.rank * per:(c.rank + 1) * per], "reduce_scatter_tensor AVG")
    ins = [on_device(mine(c.rank, rows)[i * per:(i + 1) * per]) for i in range(c.size)]
    out = c.empty((per,))
    c.dist.reduce_scatter(c.wrap(out), [c.wrap(a) for a in ins], R.AVG)
    c.check(out, full[c.rank * per:(c.rank + 1) * per], "reduce_scatter AVG")


# --------------------------------------------------------------- data movement
@case
def broadcast_from_last(c: Ctx):
    src = c.size - 1
    t = c.buf((3, 2))
    c.dist.broadcast(c.wrap(t), src)
    c.check(t, c.vals((3, 2), src), "broadcast")
    t = c.buf((4,), salt=1)
    c.dist.broadcast(c.wrap(t), group_src=0, async_op=True).wait()
    c.check(t, c.vals((4,), 0, salt=1), "broadcast group_src async")


@case
def all_gather_uneven_and_even(c: Ctx):
    mine = c.buf((c.rank % 3,))
    outs = [c.empty((r % 3,)) for r in range(c.size)]
    c.dist.all_gather([c.wrap(o) for o in outs], c.wrap(mine))
    for r in range(c.size):
        c.check(outs[r], c.vals((r % 3,), r), f"all_gather from {r}")
    mine = c.buf((2, 2))
    outs = [c.empty((2, 2)) for _ in range(c.size)]
    c.dist.all_gather([c.wrap(o) for o in outs], c.wrap(mine), async_op=True).wait()
    for r in range(c.size):
        c.check(outs[r], c.vals((2, 2), r), f"all_gather 2-D from {r}")


@case
def all_gather_into_tensor_concat(c: Ctx):
    out = c.empty((c.size * 2, 3))
    c.dist.all_gather_into_tensor(c.wrap(out), c.wrap(c.buf((2, 3))))
    c.check(out, np.concatenate([c.vals((2, 3), r) for r in range(c.size)]), "all_gather_into_tensor")


@case
def gather_scatter_uneven(c: Ctx):
    dst = 0
    gl = [c.empty((r + 1,)) for r in range(c.size)] if c.rank == dst else None
    c.dist.gather(c.wrap(c.buf((c.rank + 1,))), [c.wrap(g) for g in gl] if gl else None, group_dst=dst)
    if c.rank == dst:
        for r in range(c.size):
            c.check(gl[r], c.vals((r + 1,), r), f"gather from {r}")
    src = c.size - 1
    out = c.empty((c.rank % 2 + 1, 2))
    sl = [c.wrap(c.buf((r % 2 + 1, 2), salt=r)) for r in range(c.size)] if c.rank == src else []
    c.dist.scatter(c.wrap(out), sl, src=src)
    c.check(out, c.vals((c.rank % 2 + 1, 2), src, salt=c.rank), "scatter")


@case
def all_to_all_uneven_zero_splits(c: Ctx):
    ins = [c.buf(((c.rank + j) % 3,), salt=j) for j in range(c.size)]
    outs = [c.empty(((i + c.rank) % 3,)) for i in range(c.size)]
    c.dist.all_to_all([c.wrap(o) for o in outs], [c.wrap(a) for a in ins])
    for i in range(c.size):
        c.check(outs[i], c.vals(((i + c.rank) % 3,), i, salt=c.rank), f"all_to_all from {i}")


@case
def all_to_all_single_splits(c: Ctx):
    isz = [(c.rank + j) % 3 for j in range(c.size)]
    osz = [(i + c.rank) % 3 for i in range(c.size)]
    inp = c.buf((sum(isz), 2))
    base = c.empty((2 * sum(osz), 2))
    out = base[::2]  # non-contiguous output: staged and written back
    work = c.dist.all_to_all_single(c.wrap(out), c.wrap(inp), osz, isz, async_op=True)
    work.wait()
    want = []
    for i in range(c.size):
        theirs = c.vals((sum((i + j) % 3 for j in range(c.size)), 2), i)
        start = sum((i + j) % 3 for j in range(c.rank))
        want.append(theirs[start:start + osz[i]])
    c.check(base[::2], np.concatenate(want), "all_to_all_single uneven")
    inp = c.buf((c.size * 2,))
    out = c.empty((c.size * 2,))
    c.dist.all_to_all_single(c.wrap(out), c.wrap(inp))
    c.check(out, np.concatenate([c.vals((c.size * 2,), i)[2 * c.rank:2 * c.rank + 2] for i in range(c.size)]),
            "all_to_all_single even")


@case
def aliased_input_and_output(c: Ctx):
    t = c.buf((c.size * 2,))
    c.dist.all_to_all_single(c.wrap(t), c.wrap(t))  # in place, as torch users write it
    c.check(t, np.concatenate([c.vals((c.size * 2,), i)[2 * c.rank:2 * c.rank + 2] for i in range(c.size)]),
            "in-place all_to_all_single")
    outs = [c.empty((3,)) for _ in range(c.size)]
    outs[c.rank][...] = c.buf((3,))
    c.dist.all_gather([c.wrap(o) for o in outs], c.wrap(outs[c.rank]))  # input is this rank's output slot
    for r in range(c.size):
        c.check(outs[r], c.vals((3,), r), f"all_gather into own slot from {r}")


# ---------------------------------------------------------------- point to point
@case
def p2p_ring_and_batch(c: Ctx):
    if c.size == 1:
        return
    nxt, prv = (c.rank + 1) % c.size, (c.rank - 1) % c.size
    got = c.empty((3,))
    sw = c.dist.isend(c.wrap(c.buf((3,))), nxt, tag=3)
    src = c.dist.recv(c.wrap(got), prv, tag=3)
    sw.wait()
    assert src == prv, (src, prv)
    c.check(got, c.vals((3,), prv), "ring recv")
    got = c.empty((2, 2))
    ops = [c.dist.P2POp(c.dist.irecv, c.wrap(got), prv, tag=4),
           c.dist.P2POp(c.dist.isend, c.wrap(c.buf((2, 2), salt=4)), nxt, tag=4)]
    for w in c.dist.batch_isend_irecv(ops):
        w.wait()
    c.check(got, c.vals((2, 2), prv, salt=4), "batch_isend_irecv")


# ------------------------------------------------------- dtype-independent checks
def misc(fn):
    _MISC.append(fn)
    return fn


@misc
def barriers(dist):
    assert dist.barrier() is None
    work = dist.barrier(async_op=True)
    work.wait()
    assert work.is_completed()
    dist.monitored_barrier(timeout=60)
    dist.monitored_barrier(timeout=60, wait_all_ranks=True)


@misc
def object_collectives(dist):
    rank, size = dist.get_rank(), dist.get_world_size()
    objs = [None, None] if rank else [{"a": [1, 2]}, lambda x: x + 1]  # cloudpickle: lambdas too
    dist.broadcast_object_list(objs, src=0)
    assert objs[0] == {"a": [1, 2]} and objs[1](1) == 2
    got = [None] * size
    dist.all_gather_object(got, ("r", rank, "x" * rank))
    assert got == [("r", r, "x" * r) for r in range(size)]
    dst = size - 1
    gl = [None] * size if rank == dst else None
    dist.gather_object({"rank": rank}, gl, dst=dst)
    if rank == dst:
        assert gl == [{"rank": r} for r in range(size)]
    out = [None]
    dist.scatter_object_list(out, [f"to {r}" * (r + 1) for r in range(size)] if rank == 0 else None, src=0)
    assert out == [f"to {rank}" * (rank + 1)]
    if size > 1:
        if rank == 1:
            dist.send_object_list([rank, {"k": np.arange(3)}], dst=0)
        elif rank == 0:
            box = [None, None]
            assert dist.recv_object_list(box) == 1
            assert box[0] == 1 and list(box[1]["k"]) == [0, 1, 2]


@misc
def recv_from_any_source(dist):
    rank, size = dist.get_rank(), dist.get_world_size()
    if size == 1:
        return
    if rank == 0:
        seen = set()
        for _ in range(size - 1):
            buf = np.zeros(1, np.int64)
            src = dist.recv(buf, tag=7)
            assert buf[0] == 10 * src, (buf, src)
            seen.add(src)
        assert seen == set(range(1, size))
    else:
        dist.send(np.array([10 * rank], np.int64), 0, tag=7)


@misc
def subgroup_of_even_ranks(dist):
    rank, size = dist.get_rank(), dist.get_world_size()
    evens = list(range(0, size, 2))
    group = dist.new_group(evens)
    if rank in evens:
        t = np.array([rank, 1], np.int64)
        dist.all_reduce(t, group=group)
        assert list(t) == [sum(evens), len(evens)], t
        b = np.array([rank], np.float32)
        dist.broadcast(b, src=evens[-1], group=group)
        assert b[0] == evens[-1]
        outs = [np.zeros(1, np.int32) for _ in evens]
        dist.all_gather(outs, np.array([rank], np.int32), group=group)
        assert [o[0] for o in outs] == evens
        try:
            dist.broadcast(b, src=1, group=group)  # global rank 1 is odd: not in the group
        except ValueError as err:
            assert "src" in str(err) and str(evens) in str(err), err
        else:
            raise AssertionError("broadcast from a non-member src did not raise")
    else:
        # torch's semantics: a collective on a group this rank is not in does nothing and
        # returns None (recv: -1), leaving the tensor unchanged
        t = np.array([7.0])
        assert dist.all_reduce(t, group=group) is None and t[0] == 7.0
        assert dist.all_reduce(t, group=group, async_op=True) is None and t[0] == 7.0
        outs = [np.zeros(1) for _ in evens]
        assert dist.all_gather(outs, t, group=group) is None and not any(o[0] for o in outs)
        assert dist.recv(t, src=0, group=group) == -1
        obj = [None]
        assert dist.broadcast_object_list(obj, src=0, group=group) is None and obj == [None]
    dist.barrier()


@misc
def monitored_barrier_names_missing_ranks(dist):
    from ndist.runtime import DistTimeoutError

    rank, size = dist.get_rank(), dist.get_world_size()
    if size == 1:
        return
    if rank == 0:  # the other ranks never enter it
        try:
            dist.monitored_barrier(timeout=0.5, wait_all_ranks=True)
        except DistTimeoutError as err:
            missing = ", ".join(str(r) for r in range(1, size))
            assert f"{'Ranks' if size > 2 else 'Rank'} {missing} failed to pass monitoredBarrier" in str(err), err
        else:
            raise AssertionError("monitored_barrier did not time out")
    dist.barrier()


@misc
def bad_call_leaves_group_usable(dist):
    size = dist.get_world_size()
    try:
        dist.all_to_all_single(np.zeros(size), np.zeros(size), input_split_sizes=[size + 1] + [0] * (size - 1))
    except ValueError as err:
        assert "input_split_sizes" in str(err) and str(size + 1) in str(err), err
    else:
        raise AssertionError("bad split sizes did not raise")
    t = np.ones(2)
    dist.all_reduce(t)
    assert list(t) == [size, size]


def _buffer_objects(n: int, salt: int = 0) -> list:
    """Objects that only export the buffer protocol, ``n`` elements each, with a NumPy view of
    their memory: (kind, object, view); filled with ``salt``."""
    import array

    ba = bytearray(n)
    mv = memoryview(bytearray(4 * n)).cast("f")
    aa = array.array("d", bytes(8 * n))
    made = [("bytearray", ba, np.frombuffer(ba, np.uint8)), ("memoryview", mv, np.frombuffer(mv, np.float32)),
            ("array.array", aa, np.frombuffer(aa, np.float64))]
    for _, _, view in made:
        view[...] = salt
    return made


@misc
def buffer_protocol_objects(dist):
    """bytearray (uint8), a memoryview (float32) and array.array (float64): the results land in
    their own memory, on the one-buffer collectives, a rooted one and point-to-point."""
    rank, size = dist.get_rank(), dist.get_world_size()
    k = 2
    ranks = np.arange(size)
    for j, (kind, obj, view) in enumerate(_buffer_objects(k * size)):
        view[...] = np.arange(k * size) + rank
        dist.all_reduce(obj)
        assert (view == np.arange(k * size) * size + ranks.sum()).all(), (kind, "all_reduce", view)
        view[...] = rank
        dist.broadcast(obj, size - 1)
        assert (view == size - 1).all(), (kind, "broadcast", view)
        view[...] = rank + 1
        dist.reduce(obj, 0)
        assert (view == (ranks.sum() + size if rank == 0 else rank + 1)).all(), (kind, "reduce", view)
        _, part, pview = _buffer_objects(k, salt=rank)[j]
        _, out, oview = _buffer_objects(k * size)[j]
        dist.all_gather_into_tensor(out, part)
        assert (oview == np.repeat(ranks, k)).all(), (kind, "all_gather_into_tensor", oview)
        view[...] = np.arange(k * size) + rank
        dist.reduce_scatter_tensor(part, obj)
        assert (pview == np.arange(k * rank, k * rank + k) * size + ranks.sum()).all(), (kind, "reduce_scatter", pview)
        view[...] = np.arange(k * size) + 10 * rank
        dist.all_to_all_single(out, obj)
        assert (oview == (10 * np.repeat(ranks, k) + np.tile(np.arange(k * rank, k * rank + k), size))).all(), (
            kind, "all_to_all_single", oview)
        # uneven: rank r sends q + 1 elements to rank q (its input: the sum of 1..size elements)
        _, uin, uview = _buffer_objects(size * (size + 1) // 2, salt=rank)[j]
        _, uout, uoview = _buffer_objects((rank + 1) * size)[j]
        dist.all_to_all_single(uout, uin, [rank + 1] * size, [q + 1 for q in range(size)])
        assert (uoview == np.repeat(ranks, rank + 1)).all(), (kind, "all_to_all_single uneven", uoview)
        if size > 1:
            _, got, gview = _buffer_objects(k)[j]
            work = dist.isend(part, dst=(rank + 1) % size, tag=7)
            dist.recv(got, src=(rank - 1) % size, tag=7)
            work.wait()
            assert (gview == pview_of(rank - 1, size, k)).all(), (kind, "send/recv", gview)


def pview_of(rank: int, size: int, k: int) -> np.ndarray:
    """What ``buffer_protocol_objects``' reduce_scatter left in rank ``rank``'s part (sent on by p2p)."""
    rank %= size
    return np.arange(k * rank, k * rank + k) * size + np.arange(size).sum()
