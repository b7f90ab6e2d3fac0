"""Quick socket-backend timing: all_reduce / all_to_all at a few sizes, N processes.

    python benchmarks/socket_quick.py [-n 2] [--transport auto|tcp|shm] [--mpi]

Ranks are spawned processes sharing a Manager-backed store (benchmark only).
``--mpi`` times the same ops through mpi4py under ``mpiexec`` for comparison.
Prints time per op and busbw (nccl-tests convention).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from datetime import timedelta
from types import SimpleNamespace

import numpy as np

SIZES = [int(s) for s in os.environ.get("BENCH_SIZES", "").split(",") if s] or [4 << 10, 64 << 10, 1 << 20, 16 << 20]


class _MgrStore:
    def __init__(self, d):
        self.d = d

    def set(self, k, v):
        self.d[k] = v if isinstance(v, bytes) else v.encode()

    def get(self, k):
        for _ in range(100000):
            if k in self.d:
                return self.d[k]
            time.sleep(0.001)
        raise TimeoutError(k)


def _iters(nbytes):
    return 2000 if nbytes <= 64 << 10 else (200 if nbytes <= 1 << 20 else 30)


def _rank(rank, n, d, transport, q):
    from ndist.collectives import Call, Op, ReduceOp
    from ndist.collectives.backends.socket import SocketBackend
    from ndist.runtime import BackendContext

    ctx = BackendContext(_MgrStore(d), rank, n, timedelta(seconds=60), "bench", tuple(range(n)), "cpu",
                         SimpleNamespace(transport=transport))
    b = SocketBackend(ctx)
    rows = []
    prof = None
    if rank == 0 and os.environ.get("BENCH_PROFILE"):
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    for nbytes in SIZES:
        x = np.ones(nbytes // 4, np.float32)
        ins = [np.ones(nbytes // 4 // n, np.float32) for _ in range(n)]
        outs = [np.empty(nbytes // 4 // n, np.float32) for _ in range(n)]
        ar = Call(Op.ALL_REDUCE, "cpu", x.dtype, out=x, redop=ReduceOp.SUM)
        a2a = Call(Op.ALL_TO_ALL, "cpu", x.dtype, outputs=outs, inputs=ins)
        for name, call in (("all_reduce", lambda: b.all_reduce(ar, blocking=True)),
                           ("all_to_all", lambda: b.all_to_all(a2a, blocking=True))):
            it = _iters(nbytes)
            for _ in range(max(3, it // 10)):
                call().wait()
            b.barrier(Call(Op.BARRIER, "cpu"), blocking=True).wait()
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(it):
                call().wait()
            dt = (time.perf_counter() - t0) / it
            rows.append((name, nbytes, dt, (time.process_time() - c0) / it))
    if prof is not None:
        prof.disable()
        prof.dump_stats(os.environ["BENCH_PROFILE"])
    b.close()
    if rank == 0:
        q.put(rows)


def _mpi(n):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rows = []
    for nbytes in SIZES:
        x = np.ones(nbytes // 4, np.float32)
        y = np.empty_like(x)
        for name, call in (("all_reduce", lambda: comm.Allreduce(x, y, op=MPI.SUM)),
                           ("all_to_all", lambda: comm.Alltoall(x, y))):
            it = _iters(nbytes)
            for _ in range(max(3, it // 10)):
                call()
            comm.Barrier()
            t0 = time.perf_counter()
            c0 = time.process_time()
            for _ in range(it):
                call()
            rows.append((name, nbytes, (time.perf_counter() - t0) / it, (time.process_time() - c0) / it))
    return rows


def _print(rows, n, label):
    for name, nbytes, dt, cpu in rows:
        factor = 2 * (n - 1) / n if name == "all_reduce" else (n - 1) / n
        print(f"{label:8s} {name:11s} n={n} {nbytes:>10d} B  {dt * 1e6:10.1f} us  cpu {cpu * 1e6:10.1f} us  "
              f"busbw {nbytes / dt * factor / 1e9:6.2f} GB/s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=2)
    ap.add_argument("--transport", default="auto")
    ap.add_argument("--mpi", action="store_true")
    a = ap.parse_args()
    if a.mpi:
        rows = _mpi(a.n)
        from mpi4py import MPI

        if MPI.COMM_WORLD.rank == 0:
            _print(rows, MPI.COMM_WORLD.size, "mpich")
        return
    os.environ.setdefault("NDIST_SECRET", "bench")
    ctx = mp.get_context("spawn")
    with ctx.Manager() as m:
        d = m.dict()
        q = ctx.Queue()
        ps = [ctx.Process(target=_rank, args=(r, a.n, d, a.transport, q)) for r in range(a.n)]
        for p in ps:
            p.start()
        rows = q.get(timeout=600)
        for p in ps:
            p.join()
    _print(rows, a.n, a.transport)


if __name__ == "__main__":
    sys.exit(main())
