"""Where the time goes across "hosts": each rank's CPU per call, ndist against MPICH.

    sudo python benchmarks/multihost_cpu.py --hosts 2 --per-host 2 --op broadcast --sizes 4K,64K,1M
    sudo python benchmarks/multihost_cpu.py --hosts 4 --per-host 1 --op all_gather --sizes 4K

``benchmarks/multihost.py --compare`` says how long a call takes; this says what each rank
spent on it. The same hosts (network namespaces, ``ndist.testing.make_hosts``), ndist under
``ndistrun --nnodes H`` and mpi4py under MPICH's Hydra with UCX over TCP between hosts
(``multihost.mpich_command``). Every rank runs ``--iters`` back-to-back calls of ``--op``
(float32; broadcast from rank 0; all_to_all: the buffer in n equal parts) after 300 untimed ones and a barrier, and reports its wall
time per call and its own CPU time per call (``getrusage`` over the loop: user and system)
and context switches per call. Per library and size, ``--rounds`` rounds (the libraries
alternate, the first one rotating); the row shown is the round of median wall time.

Printed per size: each library's wall time per call (the slowest rank), its CPU per call
summed over the ranks (user + system) and the ranks' involuntary context switches per
call, then the ratios ndist/MPICH of wall time and of CPU. When ranks outnumber cores
(4 ranks on a 2-core machine), the wall time is the CPU per call over the cores: the
ratio of CPU is the ratio of time (docs/performance.md, "What bounds the open targets").
Needs root, iproute2 and mpi4py with MPICH.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ndist.bench import parse_size

OPS = ("broadcast", "all_reduce", "all_gather", "all_to_all")
LIBS = ("ndist", "mpi4py")
WARMUP = 300
_TAG = "MHCPU "


# ------------------------------------------------------------------ one rank
def worker(lib: str, nbytes: int, iters: int, op: str) -> None:
    """One rank: the timed loop, then one line ``MHCPU {json}`` on stdout."""
    import numpy as np

    buf = np.ones(max(1, nbytes // 4), np.float32)
    if lib == "ndist":
        import ndist.distributed as dist

        dist.init_process_group("socket")
        rank, n = dist.get_rank(), dist.get_world_size()
        out = np.empty(buf.size * n, np.float32)
        run = {"broadcast": lambda: dist.broadcast(buf, 0), "all_reduce": lambda: dist.all_reduce(buf),
               "all_gather": lambda: dist.all_gather_into_tensor(out, buf),
               "all_to_all": lambda: dist.all_to_all_single(out[:buf.size], buf)}[op]
        barrier = dist.barrier
        engine = dist.get_engine()
    else:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        rank, n = comm.rank, comm.size
        out = np.empty(buf.size * n, np.float32)
        run = {"broadcast": lambda: comm.Bcast(buf, 0), "all_reduce": lambda: comm.Allreduce(MPI.IN_PLACE, buf),
               "all_gather": lambda: comm.Allgather(buf, out),
               "all_to_all": lambda: comm.Alltoall(buf, out[:buf.size])}[op]
        barrier = comm.Barrier
        engine = "MPICH"
    if op == "all_reduce":
        buf[:] = 0  # (sums of zeros: no overflow to inf over many calls)
    for _ in range(WARMUP):
        run()
    barrier()
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(iters):
        run()
    t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    barrier()
    per = 1e6 / iters
    print(_TAG + json.dumps({
        "rank": rank, "size": n, "engine": engine, "netns": os.readlink("/proc/self/ns/net"), "wall_us": (t1 - t0) * per,
        "user_us": (r1.ru_utime - r0.ru_utime) * per, "sys_us": (r1.ru_stime - r0.ru_stime) * per,
        "ivcsw": (r1.ru_nivcsw - r0.ru_nivcsw) / iters, "vcsw": (r1.ru_nvcsw - r0.ru_nvcsw) / iters}), flush=True)
    if lib == "ndist":
        dist.destroy_process_group()


# ------------------------------------------------------------------ the driver
def _rows(out: str) -> list[dict]:
    dec, rows = json.JSONDecoder(), []
    for part in out.split(_TAG)[1:]:  # (ndistrun's prefixes may join lines)
        rows.append(dec.raw_decode(part)[0])
    return rows


def run_one(hosts, ssh: Path, lib: str, per_host: int, nbytes: int, iters: int, op: str, timeout: float) -> dict:
    """One job of ``lib``: every rank's row, summed."""
    from multihost import mpich_command
    from ndist.testing import ndist_env, node_commands

    argv = [str(Path(__file__).resolve()), "--worker", lib, str(nbytes), str(iters), op]
    if lib == "ndist":
        env = ndist_env()
        cmds = node_commands(hosts, per_host, argv)
    else:
        env = dict(os.environ)
        cmds = [mpich_command(hosts, per_host, ssh, [sys.executable, *argv])]
    procs = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in cmds]
    rows, errors = [], []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            rows += _rows(out)
            if p.returncode:
                errors.append(f"exit {p.returncode}: {err[-1500:]}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    n = len(hosts.ns) * per_host
    if errors or len(rows) != n:
        raise RuntimeError(f"{lib}: {len(rows)} of {n} ranks reported; " + "; ".join(errors))
    spread = {r["netns"] for r in rows}
    if len(spread) != len(hosts.ns):  # (every host's ranks in its own namespace: the calls cross the links)
        raise RuntimeError(f"{lib}: its ranks ran in {len(spread)} network namespaces, expected {len(hosts.ns)}")
    return {"wall_us": max(r["wall_us"] for r in rows), "cpu_us": sum(r["user_us"] + r["sys_us"] for r in rows),
            "user_us": sum(r["user_us"] for r in rows), "sys_us": sum(r["sys_us"] for r in rows),
            "ivcsw": sum(r["ivcsw"] for r in rows), "engine": rows[0]["engine"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=2, help="hosts (namespaces); default 2")
    ap.add_argument("--per-host", type=int, default=2, help="ranks per host; default 2")
    ap.add_argument("--op", default="broadcast", choices=OPS, help="default broadcast")
    ap.add_argument("--sizes", default="4K,64K,1M", help="comma-separated byte sizes (K, M suffixes); default 4K,64K,1M")
    ap.add_argument("--iters", type=int, default=0,
                    help="timed calls per job; default about 1 s of calls (30,000 at 4 KiB down to 1,000 at 1 MiB)")
    ap.add_argument("--rounds", type=int, default=3, help="jobs per library and size (the row is the round of median wall time); default 3")
    ap.add_argument("--libs", default="ndist,mpi4py", help="comma list of ndist, mpi4py; default both")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per job")
    ap.add_argument("--worker", nargs=4, metavar=("LIB", "BYTES", "ITERS", "OP"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        lib, nbytes, iters, op = args.worker
        worker(lib, int(nbytes), int(iters), op)
        return 0
    libs = [x for x in args.libs.split(",") if x]
    if not libs or any(x not in LIBS for x in libs):
        raise SystemExit(f"multihost_cpu: --libs: expected a comma list of {', '.join(LIBS)}; got {args.libs!r}")
    sizes = [parse_size(x, name="--sizes") for x in args.sizes.split(",") if x]

    from multihost import write_ssh_script
    from ndist.testing import make_hosts

    def skip(reason):
        raise SystemExit(f"multihost_cpu: {reason}")

    print(f"# {args.op}, {args.hosts} hosts x {args.per_host} ranks on {os.cpu_count()} cores; the round of median wall "
          f"time of {args.rounds}; cpu: summed over the ranks (user + sys), ivcsw: involuntary switches per call")
    print(f"# {'bytes':>9} {'library':>8} {'engine':>7} {'wall us':>9} {'cpu us':>9} {'user':>8} {'sys':>8} "
          f"{'ivcsw':>6}")
    with make_hosts(args.hosts, skip) as hosts, tempfile.TemporaryDirectory(prefix="ndist-mhcpu-") as tmp:
        ssh = write_ssh_script(hosts, Path(tmp))
        for nbytes in sizes:
            iters = args.iters or max(1000, min(30000, (120 << 20) // max(nbytes, 1)))
            got: dict[str, list[dict]] = {lib: [] for lib in libs}
            for rnd in range(args.rounds):
                for lib in libs[rnd % len(libs):] + libs[:rnd % len(libs)]:
                    got[lib].append(run_one(hosts, ssh, lib, args.per_host, nbytes, iters, args.op, args.timeout))
            # each library's round of median wall time (the lower middle of an even count), whole:
            # its columns add up (user + sys = cpu), as medians of each column would not
            med = {lib: sorted(rs, key=lambda r: r["wall_us"])[(len(rs) - 1) // 2] for lib, rs in got.items()}
            for lib in libs:
                m = med[lib]
                print(f"  {nbytes:>9} {lib:>8} {m['engine']:>7} {m['wall_us']:9.2f} {m['cpu_us']:9.2f} "
                      f"{m['user_us']:8.2f} {m['sys_us']:8.2f} {m['ivcsw']:6.2f}")
            if "ndist" in med and "mpi4py" in med:  # (one line, for the docs and the test to read)
                a, b = med["ndist"], med["mpi4py"]
                print(f"  {nbytes:>9} ndist/MPICH: wall {a['wall_us'] / b['wall_us']:.2f}x, "
                      f"cpu {a['cpu_us'] / b['cpu_us']:.2f}x")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
