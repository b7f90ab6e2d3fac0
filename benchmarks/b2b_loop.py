"""Back to back: 200 untimed, then N timed blocking 4 KiB float32 calls of each op in a
plain loop; prints the slowest rank's microseconds per call.

    ndistrun --nproc-per-node 2 benchmarks/b2b_loop.py ndist ar,a2a,bc,bar 2000
    mpiexec -n 2 python benchmarks/b2b_loop.py mpi4py ar,a2a,bc,bar 2000

ops: ar (all_reduce in place), a2a (all_to_all_single, even), bc (broadcast from 0),
bar (barrier). The ``ndist`` side reports its engine (``NDIST_ENGINE``)."""

from __future__ import annotations

import sys
import time

import numpy as np


def main() -> None:
    side, names, count = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]) if len(sys.argv) > 3 else 2000
    x, o = np.ones(1024, np.float32), np.empty(1024, np.float32)
    if side == "mpi4py":
        from mpi4py import MPI
        c = MPI.COMM_WORLD
        rank, size, label = c.rank, c.size, "mpi4py"
        ops = {"ar": lambda: c.Allreduce(MPI.IN_PLACE, x), "a2a": lambda: c.Alltoall(x, o),
               "bc": lambda: c.Bcast(x, 0), "bar": c.Barrier}
        barrier, slowest = c.Barrier, lambda us: c.allreduce(us, op=MPI.MAX)
    elif side == "ndist":
        import ndist.distributed as dist
        dist.init_process_group("socket")
        rank, size, label = dist.get_rank(), dist.get_world_size(), f"ndist[{dist.get_engine()}]"
        ops = {"ar": lambda: dist.all_reduce(x), "a2a": lambda: dist.all_to_all_single(o, x),
               "bc": lambda: dist.broadcast(x, 0), "bar": dist.barrier}
        barrier = dist.barrier

        def slowest(us: float) -> float:
            t = np.array([us])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return float(t[0])
    else:
        raise SystemExit(f"side: expected 'ndist' or 'mpi4py', got {side!r}")
    for name in names:
        if name not in ops:
            raise SystemExit(f"op: expected one of {sorted(ops)}, got {name!r}")
        fn = ops[name]
        for _ in range(200):
            fn()
        barrier()
        t0 = time.perf_counter()
        for _ in range(count):
            fn()
        us = slowest((time.perf_counter() - t0) / count * 1e6)
        if rank == 0:
            print(f"{label} {name} n={size} {us:.2f} us/call", flush=True)
    if side == "ndist":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
