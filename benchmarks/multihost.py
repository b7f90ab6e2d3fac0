"""all_reduce across "hosts": network namespaces with ``tc netem`` on their links,
the socket backend's two-level algorithms against the flat ones.

    sudo python benchmarks/multihost.py                       # 3 hosts x 2 ranks, 64K and 16M
    sudo python benchmarks/multihost.py --hosts 4 --per-host 4 --sizes 4K,64K,1M,16M \\
        --delay 0.5ms --rate 10gbit --iters 20 --warmup 5 --rounds 3

H namespaces joined by a bridge (``tests/netns_hosts.py``), ``tc netem
<delay> rate <rate>`` on every host's interface (where the kernel lacks
sch_netem: ``tbf`` for the rate alone, and the header says so), then per algorithm family one
``ndistrun --nnodes H --nproc-per-node R`` job (one launcher per namespace)
running, for each size, ``--warmup`` all_reduce calls and ``--rounds`` timed
batches of ``--iters`` (float32, SUM; each batch between two barriers, its
time the slowest rank's). ``NDIST_ALGO=auto`` gives the two-level algorithms,
``NDIST_ALGO=flat`` the single-level choice (today's, as if every rank were on
one host). Prints one row per size: median batch time per call of both and
their ratio. Needs root, iproute2 and ``tc`` (sch_netem); the namespaces are
removed on exit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from netns_hosts import launch_nodes, make_hosts, ndist_env, outputs, wait_launchers  # noqa: E402

_JOB = """
import json, sys, time
import numpy as np
import ndist.distributed as dist

out, sizes, warmup, iters, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
dist.init_process_group("socket")
rank, n = dist.get_rank(), dist.get_world_size()
rows = []
for nbytes in map(int, sizes.split(",")):
    x = np.ones(max(1, nbytes // 4), np.float32)
    for _ in range(warmup):
        dist.all_reduce(x)
    times = []
    for _ in range(rounds):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        t = np.array([time.perf_counter() - t0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times.append(float(t[0]) / iters)
    x[:] = 1
    dist.all_reduce(x)
    rows.append({"bytes": nbytes, "times": times, "ok": bool((x == n).all())})
if rank == 0:
    with open(out, "w") as f:
        json.dump(rows, f)
dist.destroy_process_group()
"""


def _size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "KMG" else s) * mult)


def _run(hosts, args, algo: str, folder: Path) -> list:
    folder.mkdir()
    job = folder / "job.py"
    job.write_text(textwrap.dedent(_JOB))
    result = folder / "result.json"
    sizes = ",".join(str(_size(s)) for s in args.sizes.split(","))
    env = ndist_env(NDIST_ALGO=algo)
    procs = launch_nodes(hosts, args.per_host, [str(job), str(result), sizes, str(args.warmup), str(args.iters),
                                                str(args.rounds)], env, folder)
    codes = wait_launchers(procs, args.timeout, late="timeout")
    if codes != [0] * len(procs):
        errs = "\n".join(e[-2000:] for _, e in outputs(folder, len(procs)))
        raise SystemExit(f"NDIST_ALGO={algo}: launchers exited {codes}\n{errs}")
    return json.loads(result.read_text())


def _fmt(s: float) -> str:
    return f"{s * 1e3:9.3f} ms" if s >= 1e-3 else f"{s * 1e6:9.1f} us"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--per-host", type=int, default=2)
    ap.add_argument("--sizes", default="64K,16M", help="comma-separated byte sizes (K, M suffixes)")
    ap.add_argument("--delay", default="1ms", help="netem delay on every host's link (each way)")
    ap.add_argument("--rate", default="1gbit", help="netem rate on every host's link")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--algos", default="auto,flat", help="NDIST_ALGO values to compare")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per job")
    args = ap.parse_args(argv)

    def skip(reason):
        raise SystemExit(f"multihost: {reason}")

    algos = args.algos.split(",")
    with make_hosts(args.hosts, skip) as hosts, tempfile.TemporaryDirectory() as tmp:
        shaping = hosts.shape(args.delay, args.rate)
        results = {a: _run(hosts, args, a, Path(tmp) / a) for a in algos}
    print(f"# multihost: {args.hosts} hosts x {args.per_host} ranks, {shaping} on every host link, "
          f"all_reduce float32 SUM, {args.iters} calls x {args.rounds} rounds (median), warm-up {args.warmup}")
    print(f"# NDIST_ALGO: {', '.join(algos)} (auto: two levels across hosts; flat: one level)")
    head = f"{'bytes':>10} " + " ".join(f"{a:>13}" for a in algos)
    if len(algos) == 2:
        head += f" {algos[1] + '/' + algos[0]:>12}"
    print(head)
    for i, row in enumerate(results[algos[0]]):
        med = [statistics.median(results[a][i]["times"]) for a in algos]
        ok = all(results[a][i]["ok"] for a in algos)
        line = f"{row['bytes']:>10} " + " ".join(f"{_fmt(m):>13}" for m in med)
        if len(algos) == 2:
            line += f" {med[1] / med[0]:>11.2f}x"
        print(line + ("" if ok else "  WRONG RESULT"))
    return 0


if __name__ == "__main__":
    if os.geteuid() != 0:
        raise SystemExit("multihost: needs root (network namespaces, tc)")
    sys.exit(main())
