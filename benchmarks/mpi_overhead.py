"""ndist's mpi backend (public API) against raw mpi4py on the same buffers.

    mpiexec -n 2 python benchmarks/mpi_overhead.py [--sizes-mib 1 4 16] [--iters 40]

Both sides run alternately, one iteration each, so a noisy machine hits both
alike; the table shows the best (minimum) times, the least disturbed by other
load, and the ratio ndist / mpi4py.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", type=float, nargs="+", default=[1, 4, 16])
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()

    import ndist.distributed as dist
    from mpi4py import MPI

    dist.init_process_group("mpi")
    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    rows = []
    for mib in args.sizes_mib:
        n = int(mib * 2**20) // 4 // size * size
        a = np.ones(n, np.float32)
        out = np.empty_like(a)
        k = n // size
        counts, displs = [k] * size, [i * k for i in range(size)]
        small = np.ones(k, np.float32)
        cases = {
            "all_reduce": (lambda: comm.Allreduce(MPI.IN_PLACE, [a, MPI.FLOAT], MPI.SUM),
                           lambda: dist.all_reduce(a)),
            "all_to_all_single": (lambda: comm.Alltoall([a, k, MPI.FLOAT],
                                                         [out, k, MPI.FLOAT]),
                                  lambda: dist.all_to_all_single(out, a)),
            "all_gather_into_tensor": (lambda: comm.Allgather([small, MPI.FLOAT], [out, MPI.FLOAT]),
                                       lambda: dist.all_gather_into_tensor(out, small)),
            "broadcast": (lambda: comm.Bcast([a, MPI.FLOAT], 0), lambda: dist.broadcast(a, 0)),
        }
        for name, (raw, ours) in cases.items():
            times = {"raw": [], "ndist": []}
            for i in range(args.warmup + args.iters):
                for label, fn in (("raw", raw), ("ndist", ours)):
                    comm.Barrier()
                    start = time.perf_counter()
                    fn()
                    elapsed = time.perf_counter() - start
                    if i >= args.warmup:
                        times[label].append(elapsed)
            r, o = min(times["raw"]), min(times["ndist"])
            rows.append((mib, name, r * 1e3, o * 1e3, o / r))
    if rank == 0:
        print(f"{'MiB':>5} {'op':<24} {'mpi4py ms':>10} {'ndist ms':>10} {'ratio':>7}")
        for mib, name, r, o, ratio in rows:
            print(f"{mib:>5g} {name:<24} {r:>10.3f} {o:>10.3f} {ratio:>7.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
