"""Soak test: thousands of random collectives on N ranks, every result checked against NumPy.

    python tools/trials/soak.py [--ops 10000] [--ranks 4] [--seed 0] [--backend socket] [--transport auto]

Every rank draws the same sequence of operations from ``--seed`` (op, group,
dtype, sizes including empty and uneven splits, reduce op, root, async or not)
and regenerates every rank's input from (seed, op index, rank), so it can
compute what its outputs must be with NumPy alone. Groups: the world and three
subgroups. Async operations are waited in batches, in issue order. Prints
``trials``, ``errors`` (wrong results and raised exceptions) and the time, and
exits 1 on any error. ``tests/soak/test_soak.py`` runs the same with 500 ops.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

DTYPES = ("float32", "float64", "float16", "int32", "int64", "uint8", "complex64", "bool")
OPS = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "gather", "scatter",
       "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "barrier")
SUBGROUPS = ((0, 1), (1, 2, 3), (0, 2))


def _redops(dtype: str):
    if dtype == "bool":
        return ()
    if dtype.startswith("float"):
        return ("SUM", "PRODUCT", "MIN", "MAX", "AVG")
    if dtype.startswith("complex"):
        return ("SUM", "PRODUCT", "AVG")
    return ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")


def _data(seed: int, i: int, rank: int, dtype: str, n: int, redop: str | None = None) -> np.ndarray:
    rng = np.random.default_rng([seed, i, rank])
    if dtype == "bool":
        return rng.random(n) < 0.5
    if dtype.startswith("complex"):
        re, im = rng.uniform(0.5, 1.5, n), rng.uniform(-0.5, 0.5, n)
        return (re + 1j * im).astype(dtype)
    if dtype.startswith("float"):
        lo, hi = (0.5, 1.5) if redop == "PRODUCT" else (-8, 8)
        return rng.uniform(lo, hi, n).astype(dtype)
    if dtype == "uint8":
        return rng.integers(0, 256, n, dtype=np.uint8)
    return rng.integers(-1000, 1000, n).astype(dtype)


def _reduce(arrays, redop: str, dtype: str) -> np.ndarray:
    acc = arrays[0].copy()
    for a in arrays[1:]:
        if redop in ("SUM", "AVG"):
            acc = acc + a
        elif redop == "PRODUCT":
            acc = acc * a
        elif redop == "MIN":
            acc = np.minimum(acc, a)
        elif redop == "MAX":
            acc = np.maximum(acc, a)
        elif redop == "BAND":
            acc = acc & a
        elif redop == "BOR":
            acc = acc | a
        elif redop == "BXOR":
            acc = acc ^ a
        acc = acc.astype(dtype)
    if redop == "AVG":
        acc = (acc / len(arrays)).astype(dtype)
    return acc


def _close(got: np.ndarray, want: np.ndarray, dtype: str) -> bool:
    if got.shape != want.shape:
        return False
    if dtype in ("float16",):
        return bool(np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=2e-2, atol=0.5))
    if dtype in ("float32", "complex64"):
        return bool(np.allclose(got, want, rtol=1e-4, atol=1e-4))
    if dtype == "float64":
        return bool(np.allclose(got, want, rtol=1e-10, atol=1e-10))
    return bool(np.array_equal(got, want))


class _Plan:
    """The op sequence every rank draws identically."""

    def __init__(self, seed: int, size: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.size = size

    def draw(self, i: int, groups) -> dict:
        r = self.rng
        op = OPS[r.integers(len(OPS))]
        g = 0 if r.random() < 0.6 or len(groups) == 1 else int(r.integers(1, len(groups)))
        ranks = groups[g][0]
        n = len(ranks)
        dtype = DTYPES[r.integers(len(DTYPES))]
        if op in ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor"):
            while not _redops(dtype):
                dtype = DTYPES[r.integers(len(DTYPES))]
        redops = _redops(dtype)
        redop = redops[r.integers(len(redops))] if redops else None
        big = r.random() < 0.05
        count = int(r.integers(0, 70_000)) if big else int(r.choice([0, 1, 3, 17, 256, 1000, 4099]))
        sizes = r.integers(0, 50 if not big else 20_000, size=(n, n)).tolist()  # sizes[i][j]: i -> j
        root = int(r.integers(n))
        async_op = bool(r.random() < 0.3)
        return dict(op=op, group=g, dtype=dtype, redop=redop, count=count, sizes=sizes, root=root,
                    async_op=async_op, i=i)


def soak_rank(rank: int, size: int, n_ops: int, seed: int):
    """The body each rank runs (under ``ndist.testing.run_ranks``): (trials, errors, details)."""
    import ndist.distributed as dist

    groups = [(tuple(range(size)), None)]
    for ranks in SUBGROUPS:
        if max(ranks) < size:
            groups.append((ranks, dist.new_group(list(ranks))))
    plan = _Plan(seed, size)
    errors: list[str] = []
    pending: list = []
    trials = 0

    def settle():
        for work, check in pending:
            try:
                work.wait()
                check()
            except Exception as err:  # noqa: BLE001 - counted
                errors.append(f"async: {type(err).__name__}: {err}")
        pending.clear()

    for i in range(n_ops):
        p = plan.draw(i, groups)
        ranks, pg = groups[p["group"]]
        if rank not in ranks:
            continue
        trials += 1
        try:
            work, check = _run_one(dist, p, ranks, pg, rank, seed)
        except Exception as err:  # noqa: BLE001 - counted
            errors.append(f"op {i} {p['op']} {p['dtype']}: {type(err).__name__}: {err}")
            continue
        if work is None:
            try:
                check()
            except Exception as err:  # noqa: BLE001
                errors.append(f"op {i}: {type(err).__name__}: {err}")
        else:
            pending.append((work, check))
            if len(pending) >= 4:
                settle()
    settle()
    return trials, len(errors), errors[:10]


def _run_one(dist, p, ranks, pg, rank, seed):
    op, dtype, redop, i = p["op"], p["dtype"], p["redop"], p["i"]
    n, me = len(ranks), ranks.index(rank)
    sizes, root, count = p["sizes"], p["root"], p["count"]
    kw = {"group": pg, "async_op": p["async_op"]}
    rop = getattr(dist.ReduceOp, redop) if redop else None
    data = lambda r, k: _data(seed, i, ranks[r], dtype, k, redop)  # noqa: E731 - r: group rank
    failures = []

    def expect(got, want, what):
        if not _close(np.asarray(got), np.asarray(want), dtype):
            failures.append(what)

    if op == "all_reduce":
        x = data(me, count)
        w = dist.all_reduce(x, op=rop, **kw)
        check = lambda: expect(x, _reduce([data(r, count) for r in range(n)], redop, dtype), "all_reduce")  # noqa
    elif op == "reduce":
        x = data(me, count)
        w = dist.reduce(x, dst=ranks[root], op=rop, **kw)
        want = _reduce([data(r, count) for r in range(n)], redop, dtype) if me == root else data(me, count)
        check = lambda: expect(x, want, "reduce")  # noqa: E731
    elif op == "broadcast":
        x = data(me, count)
        w = dist.broadcast(x, src=ranks[root], **kw)
        check = lambda: expect(x, data(root, count), "broadcast")  # noqa: E731
    elif op == "all_gather":
        outs = [np.empty(sizes[r][0], dtype) for r in range(n)]
        w = dist.all_gather(outs, data(me, sizes[me][0]), **kw)
        check = lambda: [expect(outs[r], data(r, sizes[r][0]), "all_gather") for r in range(n)]  # noqa
    elif op == "all_gather_into_tensor":
        out = np.empty(n * count, dtype)
        w = dist.all_gather_into_tensor(out, data(me, count), **kw)
        check = lambda: expect(out, np.concatenate([data(r, count) for r in range(n)]), "all_gather_t")  # noqa
    elif op == "gather":
        outs = [np.empty(sizes[r][1 % n], dtype) for r in range(n)] if me == root else None
        w = dist.gather(data(me, sizes[me][1 % n]), outs, dst=ranks[root], **kw)
        check = (lambda: [expect(outs[r], data(r, sizes[r][1 % n]), "gather") for r in range(n)]) \
            if me == root else (lambda: None)
    elif op == "scatter":
        out = np.empty(sizes[root][me], dtype)
        ins = [data(root, sizes[root][j] + 1)[1:] for j in range(n)] if me == root else None
        w = dist.scatter(out, ins, src=ranks[root], **kw)
        check = lambda: expect(out, data(root, sizes[root][me] + 1)[1:], "scatter")  # noqa: E731
    elif op == "reduce_scatter":
        k = [sizes[0][j] for j in range(n)]  # chunk j has k[j] elements on every rank
        out = np.empty(k[me], dtype)
        ins = [data(me, sum(k))[sum(k[:j]):sum(k[:j + 1])] for j in range(n)]
        w = dist.reduce_scatter(out, ins, op=rop, **kw)
        want = _reduce([data(r, sum(k))[sum(k[:me]):sum(k[:me + 1])] for r in range(n)], redop, dtype)
        check = lambda: expect(out, want, "reduce_scatter")  # noqa: E731
    elif op == "reduce_scatter_tensor":
        out = np.empty(count, dtype)
        w = dist.reduce_scatter_tensor(out, data(me, n * count), op=rop, **kw)
        want = _reduce([data(r, n * count)[me * count:(me + 1) * count] for r in range(n)], redop, dtype)
        check = lambda: expect(out, want, "reduce_scatter_tensor")  # noqa: E731
    elif op == "all_to_all":
        ins = [data(me, sum(sizes[me]))[sum(sizes[me][:j]):sum(sizes[me][:j + 1])] for j in range(n)]
        outs = [np.empty(sizes[j][me], dtype) for j in range(n)]
        w = dist.all_to_all(outs, ins, **kw)
        check = lambda: [expect(outs[j], data(j, sum(sizes[j]))[sum(sizes[j][:me]):sum(sizes[j][:me + 1])],
                                "all_to_all") for j in range(n)]  # noqa: E731
    elif op == "all_to_all_single":
        isz = sizes[me]
        osz = [sizes[j][me] for j in range(n)]
        out = np.empty((sum(osz), 2), dtype)
        w = dist.all_to_all_single(out, data(me, 2 * sum(isz)).reshape(-1, 2), osz, isz, **kw)

        def check():
            parts = [data(j, 2 * sum(sizes[j])).reshape(-1, 2)[sum(sizes[j][:me]):sum(sizes[j][:me + 1])]
                     for j in range(n)]
            expect(out, np.concatenate(parts) if parts else out, "all_to_all_single")
    else:  # barrier
        w = dist.barrier(**kw)
        check = lambda: None  # noqa: E731

    def verdict():
        check()
        if failures:
            raise AssertionError(f"op {i} {op} {dtype} {redop or ''} group {ranks}: wrong {failures[0]}")

    return (w if p["async_op"] else None), verdict


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=10_000)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="socket")
    ap.add_argument("--transport", default=None, choices=(None, "tcp", "shm", "auto"))
    ap.add_argument("--timeout", type=float, default=3600)
    a = ap.parse_args(argv)
    import cloudpickle

    from ndist.testing import run_ranks

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    t0 = time.monotonic()
    res = run_ranks(soak_rank, a.ranks, args=(a.ops, a.seed), backend=a.backend, timeout=a.timeout,
                    transport=a.transport)
    took = time.monotonic() - t0
    trials = sum(r[0] for r in res)
    errors = sum(r[1] for r in res)
    print(f"soak: ops={a.ops} ranks={a.ranks} seed={a.seed} backend={a.backend} transport={a.transport or 'auto'} "
          f"trials={trials} (rank-ops) errors={errors} hangs=0 time={took:.1f}s")
    for rank, r in enumerate(res):
        for line in r[2]:
            print(f"  rank {rank}: {line}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
