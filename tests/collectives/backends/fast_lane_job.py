"""A small job over the repeated call in one C call (``_cnative.FastLane``, native/clane.c), with
checks: every op it runs (all_to_all_single even and with split sizes), at 16 B to 3 MiB, three calls each (the first makes the lane); run by
hand under valgrind or a sanitizer build (docs/native.md, "Memory safety")."""

import numpy as np

import ndist.distributed as dist
from ndist.runtime import world


def main() -> None:
    dist.init_process_group("socket")
    r, n = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    for nb in (16 * n, 4096, 300 << 10, 3 << 20):
        for _ in range(3):
            a = np.arange(nb // 4, dtype=np.float32) * (r + 1)
            dist.all_reduce(a)
            assert np.array_equal(a, np.arange(nb // 4, dtype=np.float32) * sum(range(1, n + 1)))
            i = np.arange(nb // 8, dtype=np.int64) * (r + 1) - 7
            dist.all_reduce(i, op=dist.ReduceOp.AVG)
            total = np.arange(nb // 8, dtype=np.int64) * sum(range(1, n + 1)) - 7 * n
            assert np.array_equal(i, np.trunc(total / n).astype(np.int64))
            b = np.full(nb // 8, r, np.float64)
            dist.broadcast(b, n - 1)
            assert (b == n - 1).all()
            rows = nb // 4 // n * n
            x, y = np.full(rows, r, np.int32), np.empty(rows, np.int32)
            dist.all_to_all_single(y, x)
            assert np.array_equal(y, np.repeat(np.arange(n, dtype=np.int32), rows // n))
            # split sizes: rank r sends rank q (q + 1) / n of an even block, in rows of 2 (the last
            # rank's blocks the largest)
            k = max(rows // n // 2, 1)
            isz, osz = [k * (q + 1) // n for q in range(n)], [k * (r + 1) // n] * n
            ux = np.concatenate([np.full((s, 2), 10 * r + q, np.int32) for q, s in enumerate(isz)])
            uy = np.empty((sum(osz), 2), np.int32)
            dist.all_to_all_single(uy, ux, osz, isz)
            assert np.array_equal(uy, np.concatenate([np.full((osz[q], 2), 10 * q + r, np.int32) for q in range(n)]))
            part, full = np.full(rows // n, r, np.float32), np.empty(rows, np.float32)
            dist.all_gather_into_tensor(full, part)
            assert np.array_equal(full, np.repeat(np.arange(n, dtype=np.float32), rows // n))
            out = np.empty(rows // n, np.float32)
            dist.reduce_scatter_tensor(out, np.full(rows, r + 1, np.float32))
            assert (out == sum(range(1, n + 1))).all()
            dist.barrier()
    kind = type(world.default.fast).__name__
    dist.destroy_process_group()
    print(f"rank {r}: engine native, repeated calls on {kind}, all checks passed")


if __name__ == "__main__":
    main()
