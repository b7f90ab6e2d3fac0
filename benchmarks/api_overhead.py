"""The public layer's cost per call: a repeated collective on the same buffers.

    python benchmarks/api_overhead.py                 # world size 1, µs per call
    mpiexec -n 2 python benchmarks/api_overhead.py --mpi   # ndist's mpi backend vs mpi4py

Without ``--mpi`` the script joins a 1-rank group (``file://`` rendezvous) and
times each op on 4 KiB float32 buffers, NumPy arrays and ``ndist.Tensor``s,
``async_op=False``, through two backends:

* ``api``: a backend registered by this script whose methods return ``DONE`` at
  once, so the time is the public layer alone: argument checks, conversion, the
  call record, numbering, the flight recorder (the issue #19 target: <= 1.5 µs);
* ``socket``: the default backend at world size 1 (all_reduce, broadcast and
  reduce_scatter return at once; all_gather and all_to_all run their copy).

With ``--mpi`` (under ``mpiexec``) each op runs through ndist's mpi backend and
through mpi4py directly on the same buffers, alternately, and the table gives
both and their ratio (the target: <= 1.1x).

Times are the median over ``--repeats`` batches of ``--calls`` calls (µs per call).
Wall-clock time on a loaded machine is noisy; for a load-independent figure count
instructions with callgrind: ``--loop N`` makes N calls of one op and nothing else,
inside ``map``'s ``next``, so (I(2N) - I(N)) / N is the instructions per call
(``benchmarks/call_counts.py`` runs this for every op and prints the table):

    PYTHONHASHSEED=0 valgrind --tool=callgrind --separate-threads=yes \\
        --collect-atstart=no --toggle-collect=map_next \\
        python benchmarks/api_overhead.py --loop 1000 --backend api --op all_reduce
    (and again with --loop 2000; read ``totals:`` of the main thread's file, ``-01``)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import timeit
from collections import deque
from itertools import repeat

import numpy as np

OPS = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single")
LOOP_OPS = OPS + ("all_to_all_single_uneven",)  # (--loop only: split sizes given)


def _register_null() -> None:
    from ndist.collectives import CollectiveBackend
    from ndist.collectives._backend import DONE
    from ndist.runtime import register_backend

    class NullBackend(CollectiveBackend):
        """Does nothing: what is left of a call's time is the public layer's."""

        name = "api"

        def _done(self, call, *, blocking=False):
            return DONE

        all_reduce = reduce = broadcast = gather = scatter = barrier = send = recv = _done
        all_to_all_single = all_gather_into = reduce_scatter_from = _done

        def close(self) -> None:
            pass

    register_backend("bench-api", NullBackend, devices=("cpu",))


def _buffers(world: int, kind: str, nbytes: int):
    import ndist

    n = nbytes // 4 // world * world
    bufs = dict(full=np.ones(n, np.float32), out=np.empty(n, np.float32),
                part=np.ones(n // world, np.float32), part_out=np.empty(n // world, np.float32))
    if kind == "tensor":
        bufs = {k: ndist.from_numpy(v) for k, v in bufs.items()}
    return bufs


def _calls(dist, b: dict) -> dict:
    n = len(b["full"])  # (an ndist.Tensor's ``size`` is a method, as torch's)
    return {
        "all_reduce": lambda: dist.all_reduce(b["full"]),
        "broadcast": lambda: dist.broadcast(b["full"], 0),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(b["out"], b["part"]),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(b["part_out"], b["full"]),
        "all_to_all_single": lambda: dist.all_to_all_single(b["out"], b["full"]),
        "all_to_all_single_uneven": lambda: dist.all_to_all_single(b["out"], b["full"], [n], [n]),
    }


def _raw_calls(comm, MPI, b: dict, world: int) -> dict:
    f, k = MPI.FLOAT, b["full"].size // world
    return {
        "all_reduce": lambda: comm.Allreduce(MPI.IN_PLACE, [b["full"], f], MPI.SUM),
        "broadcast": lambda: comm.Bcast([b["full"], f], 0),
        "all_gather_into_tensor": lambda: comm.Allgather([b["part"], f], [b["out"], f]),
        "reduce_scatter_tensor": lambda: comm.Reduce_scatter_block([b["full"], f], [b["part_out"], f], MPI.SUM),
        "all_to_all_single": lambda: comm.Alltoall([b["full"], k, f], [b["out"], k, f]),
    }


def _per_call_us(fn, calls: int, repeats: int) -> float:
    for _ in range(min(calls, 200)):
        fn()
    return statistics.median(timeit.repeat(fn, number=calls, repeat=repeats)) / calls * 1e6


def _init(backend: str):
    import ndist.distributed as dist

    if backend == "mpi":
        dist.init_process_group("mpi")
        return dist, None
    if backend == "api":
        _register_null()
    path = tempfile.mktemp(prefix="ndist-api-bench-")
    dist.init_process_group("bench-api" if backend == "api" else backend, init_method=f"file://{path}", rank=0,
                            world_size=1)
    return dist, path


def _finish(dist, path) -> None:
    dist.destroy_process_group()
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000, help="calls per timed batch")
    parser.add_argument("--repeats", type=int, default=7, help="timed batches (the median is shown)")
    parser.add_argument("--bytes", type=int, default=4096, help="buffer size")
    parser.add_argument("--mpi", action="store_true", help="ndist's mpi backend against mpi4py (under mpiexec)")
    parser.add_argument("--loop", type=int, default=0, help="make this many calls of --op, untimed (for callgrind)")
    parser.add_argument("--backend", default="api", help="--loop's backend: api, socket or mpi (raw: mpi4py)")
    parser.add_argument("--op", default="all_reduce", choices=LOOP_OPS)
    parser.add_argument("--kind", default="numpy", choices=("numpy", "tensor"))
    args = parser.parse_args()

    if args.loop:
        raw = args.backend == "raw"
        dist, path = _init("mpi" if raw else args.backend)
        world = dist.get_world_size()
        b = _buffers(world, "numpy" if raw else args.kind, args.bytes)
        if raw:
            from mpi4py import MPI

            fn = _raw_calls(MPI.COMM_WORLD.Dup(), MPI, b, world)[args.op]
        else:
            fn = _calls(dist, b)[args.op]
        for _ in range(20):
            fn()
        # every call inside map's next(): --toggle-collect=map_next counts the calls alone
        deque(map(lambda _: fn(), repeat(None, args.loop)), 0)
        _finish(dist, path)
        return

    if args.mpi:
        from mpi4py import MPI

        dist, path = _init("mpi")
        comm, world, rank = MPI.COMM_WORLD.Dup(), dist.get_world_size(), dist.get_rank()
        b = _buffers(world, "numpy", args.bytes)
        ours, raw = _calls(dist, b), _raw_calls(comm, MPI, b, world)
        rows = []
        for op in OPS:
            t_raw, t_ours = [], []
            for _ in range(args.repeats):  # alternate, so load hits both alike
                comm.Barrier()
                t_raw.append(_per_call_us(raw[op], args.calls, 1))
                comm.Barrier()
                t_ours.append(_per_call_us(ours[op], args.calls, 1))
            r, o = statistics.median(t_raw), statistics.median(t_ours)
            rows.append((op, r, o, o / r))
        if rank == 0:
            print(f"# {args.bytes} B float32, {world} rank(s), median of {args.repeats} x {args.calls} calls")
            print(f"{'op':<24} {'mpi4py us':>10} {'ndist us':>10} {'ratio':>7}")
            for op, r, o, ratio in rows:
                print(f"{op:<24} {r:>10.2f} {o:>10.2f} {ratio:>7.2f}")
        _finish(dist, None)
        return

    results: dict = {}
    for backend in ("api", "socket"):
        dist, path = _init(backend)
        for kind in ("numpy", "tensor"):
            for op, fn in _calls(dist, _buffers(1, kind, args.bytes)).items():
                results[backend, kind, op] = _per_call_us(fn, args.calls, args.repeats)
        _finish(dist, path)
    print(f"# world size 1, {args.bytes} B float32, async_op=False; µs per call, median of {args.repeats} x "
          f"{args.calls} calls ({sys.platform}, load {os.getloadavg()[0]:.1f})")
    print(f"{'op':<24} {'api numpy':>10} {'api Tensor':>11} {'socket numpy':>13} {'socket Tensor':>14}")
    for op in OPS:
        print(f"{op:<24} {results['api', 'numpy', op]:>10.2f} {results['api', 'tensor', op]:>11.2f} "
              f"{results['socket', 'numpy', op]:>13.2f} {results['socket', 'tensor', op]:>14.2f}")


if __name__ == "__main__":
    main()
