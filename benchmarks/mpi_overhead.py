"""ndist's mpi backend (public API) against raw mpi4py on the same buffers.

    mpiexec -n 2 python benchmarks/mpi_overhead.py [--sizes-mib 1 4 16] [--iters 40]

Both sides run alternately, one iteration each, so a noisy machine hits both
alike; the table shows the best (minimum) times, the least disturbed by other
load, and the ratio ndist / mpi4py.

Wall-clock time on a shared machine is noisy; for a load-independent figure,
``--loop N --op OP --side raw|ndist`` makes N calls of one op on 4 KiB float32
buffers (``--bytes``) and nothing else, inside ``map``'s ``next``, so callgrind
can count those calls alone: (I(2N) - I(N)) / N is the instructions per call (read
``totals:`` of the main thread's file, ``-01``):

    PYTHONHASHSEED=0 valgrind --tool=callgrind --separate-threads=yes \\
        --collect-atstart=no --toggle-collect=map_next \\
        python benchmarks/mpi_overhead.py --loop 1000 --op all_reduce --side ndist
"""

from __future__ import annotations

import argparse
import time
from collections import deque
from itertools import repeat

import numpy as np

LOOP_OPS = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
            "all_to_all_single", "all_to_all_single_uneven")


def _buffers(rank: int, size: int, nbytes: int) -> dict:
    """The buffers of one loop: ``nbytes`` of float32 rounded to the group size, a rank's
    part of it, and the uneven split lists (rank r sends r + 1 + q elements to rank q, so
    each rank's splits differ)."""
    n = nbytes // 4 // size * size
    k = n // size
    ins = [(rank + 1 + q) for q in range(size)]
    outs = [(q + 1 + rank) for q in range(size)]
    return dict(n=n, k=k, full=np.ones(n, np.float32), out=np.empty(n, np.float32),
                part=np.ones(k, np.float32), part_out=np.empty(k, np.float32), ins=ins, outs=outs,
                uin=np.ones(sum(ins), np.float32), uout=np.empty(sum(outs), np.float32))


def ndist_calls(dist, rank: int, size: int, nbytes: int, wrap=None) -> dict:
    """The one-op closures of ndist's public API on ``_buffers`` (also call_counts.py's);
    ``wrap`` turns each array into what the calls pass (call_counts.py: ``torch.from_numpy``)."""
    b = _buffers(rank, size, nbytes)
    if wrap is not None:
        b = {key: wrap(v) if isinstance(v, np.ndarray) else v for key, v in b.items()}
    full, out, part, part_out = b["full"], b["out"], b["part"], b["part_out"]
    uin, uout, ins, outs = b["uin"], b["uout"], b["ins"], b["outs"]
    return {
        "all_reduce": lambda: dist.all_reduce(full),
        "broadcast": lambda: dist.broadcast(full, 0),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(out, part),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(part_out, full),
        "all_to_all_single": lambda: dist.all_to_all_single(out, full),
        "all_to_all_single_uneven": lambda: dist.all_to_all_single(uout, uin, outs, ins),
    }


def _loop_calls(side: str, dist, comm, MPI, nbytes: int, wrap=None):
    """The one-op closures of ``--loop``: ndist's public API (its arrays passed as ``wrap(array)``)
    or raw mpi4py, same buffers."""
    rank, size = comm.Get_rank(), comm.Get_size()
    if side != "raw":
        return ndist_calls(dist, rank, size, nbytes, wrap)
    b = _buffers(rank, size, nbytes)
    full, out, part, part_out, k = b["full"], b["out"], b["part"], b["part_out"], b["k"]
    uin, uout, ins, outs = b["uin"], b["uout"], b["ins"], b["outs"]
    f = MPI.FLOAT
    sd = [0, *np.cumsum(ins[:-1]).tolist()]
    rd = [0, *np.cumsum(outs[:-1]).tolist()]
    return {
        "all_reduce": lambda: comm.Allreduce(MPI.IN_PLACE, [full, f], MPI.SUM),
        "broadcast": lambda: comm.Bcast([full, f], 0),
        "all_gather_into_tensor": lambda: comm.Allgather([part, f], [out, f]),
        "reduce_scatter_tensor": lambda: comm.Reduce_scatter_block([full, f], [part_out, f], MPI.SUM),
        "all_to_all_single": lambda: comm.Alltoall([full, k, f], [out, k, f]),
        "all_to_all_single_uneven": lambda: comm.Alltoallv([uin, ins, sd, f], [uout, outs, rd, f]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", type=float, nargs="+", default=[1, 4, 16])
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--loop", type=int, default=0, help="make this many calls of --op, untimed (callgrind)")
    parser.add_argument("--op", default="all_reduce", choices=LOOP_OPS)
    parser.add_argument("--side", default="ndist", choices=("ndist", "raw"))
    parser.add_argument("--bytes", type=int, default=4096, help="--loop's buffer size")
    parser.add_argument("--wrap", choices=("memoryview",), help="--loop, --side ndist: pass a memoryview of "
                        "each array (an object that only exports the buffer protocol)")
    args = parser.parse_args()

    import ndist.distributed as dist
    from mpi4py import MPI

    dist.init_process_group("mpi")
    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    if args.loop:
        fn = _loop_calls(args.side, dist, comm, MPI, args.bytes, memoryview if args.wrap else None)[args.op]
        for _ in range(20):
            fn()
        # every call inside map's next(): --toggle-collect=map_next counts the calls alone
        deque(map(lambda _: fn(), repeat(None, args.loop)), 0)
        dist.destroy_process_group()
        return
    rows = []
    for mib in args.sizes_mib:
        n = int(mib * 2**20) // 4 // size * size
        a = np.ones(n, np.float32)
        out = np.empty_like(a)
        k = n // size
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
