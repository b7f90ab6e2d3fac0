"""A small job over every collective of the native engine, with checks: run by hand under
valgrind or a sanitizer build (docs/native.md, "Memory safety")."""

import numpy as np

import ndist.distributed as dist


def main() -> None:
    dist.init_process_group("socket")
    r, n = dist.get_rank(), dist.get_world_size()
    for nb in (16, 4096, 300 << 10, 3 << 20):
        a = np.arange(nb // 4, dtype=np.float32) * (r + 1)
        dist.all_reduce(a)
        assert np.array_equal(a, np.arange(nb // 4, dtype=np.float32) * sum(range(1, n + 1)))
        b = np.full(nb // 8, r, np.float64)
        dist.broadcast(b, src=n - 1)
        assert (b == n - 1).all()
        ins = [np.full(nb // 4 // n + q, r * 10 + q, np.int32) for q in range(n)]
        outs = [np.empty(nb // 4 // n + r, np.int32) for _ in range(n)]
        dist.all_to_all(outs, ins)
        assert all((outs[q] == q * 10 + r).all() for q in range(n))
        outs = [np.empty(nb // 8, np.int64) for _ in range(n)]
        dist.all_gather(outs, np.full(nb // 8, r, np.int64))
        assert all((outs[q] == q).all() for q in range(n))
        o = np.empty(nb // 4, np.float32)
        dist.reduce_scatter(o, [np.full(nb // 4, r + q, np.float32) for q in range(n)])
        assert (o == sum(q + r for q in range(n))).all()
        dist.barrier()
        g = [np.empty(5, np.int16) for _ in range(n)] if r == 0 else None
        dist.gather(np.full(5, r, np.int16), g, dst=0)
        assert r != 0 or all((g[q] == q).all() for q in range(n))
        o = np.empty(7, np.int8)
        dist.scatter(o, [np.full(7, q, np.int8) for q in range(n)] if r == n - 1 else None, src=n - 1)
        assert (o == r).all()
        x = np.full(nb // 2, r + 1, np.float16)
        dist.reduce(x, dst=0)
        assert r != 0 or (x == sum(range(1, n + 1))).all()
        c = np.full(nb // 16, 1 + 1j * r, np.complex128)
        dist.all_reduce(c, op=dist.ReduceOp.PRODUCT)  # a NumPy fallback pair
    native = dist.group.WORLD.backend_for("cpu")._native
    g = native.g if native is not None else None
    copied = sum(getattr(x, "cma_blocks", 0) for x in (g, getattr(g, "local", None), getattr(g, "tcp", None)))
    kind = type(g).__name__
    print(f"rank {r}: engine {dist.get_engine()} ({kind}), {copied} part(s) read with one copy, all checks passed")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
