"""The memory-copy floor of an all_to_all or a broadcast on this host: what no
shared-memory implementation can beat.

    python benchmarks/copy_floor.py [--op all_to_all|broadcast] [--nproc 2] [--bytes 16M] [--rounds 20]

Each of ``nproc`` processes (forked, one per rank, as in a real job) holds a
``bytes``-sized input and output buffer. All inputs live in one shared mapping, so
each process copies its part of every peer's input straight into its output: every
byte is copied exactly once (the single-copy ideal of CMA or XPMEM; MPICH's
two-copy cells and ndist's segment path do more). Every process copies at the
same time, as in a collective. Prints the slowest rank's time per round (min and
median over rounds) and the bus bandwidth it implies, with nccl-tests' all_to_all
factor (n-1)/n, so it reads against ``ndist-bench all_to_all`` rows.

``--op broadcast``: every rank but rank 0 copies rank 0's whole input into its output
(the single-copy ideal: each receiver reads the root's buffer once; no tree, no
pipeline), all at once; the root copies nothing. Bus bandwidth as nccl-tests' broadcast
(factor 1), so it reads against ``ndist-bench broadcast`` rows.
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing as mp
import os
import time

import numpy as np

from ndist.bench import parse_size


def _rank(r, n, nbytes, rounds, shared, barrier, times, op):
    inputs = np.frombuffer(shared, dtype=np.uint8).reshape(n, nbytes)
    inputs[r] = r + 1  # touch: pages are resident, as a tensor's would be
    out = np.empty(nbytes, np.uint8)
    out[:] = 0
    part = nbytes // n
    for i in range(rounds + 2):
        barrier.wait()
        t0 = time.perf_counter()
        if op == "broadcast":
            if r:
                np.copyto(out, inputs[0])
        else:
            for p in range(n):
                np.copyto(out[p * part:(p + 1) * part], inputs[p, r * part:(r + 1) * part])
        t = time.perf_counter() - t0
        barrier.wait()
        if i >= 2:  # two warm-up rounds
            times[(i - 2) * n + r] = t
    if op == "broadcast":
        assert r == 0 or (out == 1).all()
    else:
        assert all((out[p * part:(p + 1) * part] == p + 1).all() for p in range(n))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", choices=("all_to_all", "broadcast"), default="all_to_all")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--bytes", default="16M")
    ap.add_argument("--rounds", type=int, default=20)
    a = ap.parse_args(argv)
    n, nbytes = a.nproc, parse_size(a.bytes, name="--bytes")
    nbytes -= nbytes % n
    ctx = mp.get_context("fork")
    shared = mmap.mmap(-1, n * nbytes)
    barrier = ctx.Barrier(n)
    times = ctx.Array("d", a.rounds * n, lock=False)
    procs = [ctx.Process(target=_rank, args=(r, n, nbytes, a.rounds, shared, barrier, times, a.op)) for r in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode:
            raise SystemExit(f"a copy process failed with exit code {p.exitcode}")
    slowest = sorted(max(times[i * n:(i + 1) * n]) for i in range(a.rounds))
    best, med = slowest[0], slowest[len(slowest) // 2]
    factor = (n - 1) / n if a.op == "all_to_all" else 1.0
    print(f"# copy floor of {a.op}: nproc {n}, {nbytes} B per rank, {a.rounds} rounds, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print(f"time (us): min {best * 1e6:.1f}  median {med * 1e6:.1f}")
    print(f"busbw (GB/s): at min {nbytes / best * factor / 1e9:.2f}  at median {nbytes / med * factor / 1e9:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
