"""Where each rank ran, round by round, next to the round's time: the bimodal rounds of issue 42.

In interleaved ``ndist-bench --compare`` runs at n = 2, whole rounds of small cells came out
4-5x slower than the next round. This script runs the same interleaving (ndist's and MPICH's
ranks started once, each round measuring both, the order alternating) and prints, for every
round of ndist, its time beside the CPU each rank ran on just before and just after its timed
calls and its context switches per call, so a slow round can be matched to "both ranks on one
CPU". It does so for each placement of ndist's ranks it is given (``--placements``):

* ``none``: ``ndistrun --bind-to none``: where the kernel puts them (how ``ndist-bench``
  started them before it bound them as ``ndistrun`` does);
* ``one-cpu``: ``taskset -c <first CPU> ndistrun --bind-to none``: both on one CPU;
* ``core``: ``ndistrun --bind-to core`` (its default): each rank on a CPU of its own;
* ``overload``: ``ndistrun --bind-to core:overload-allowed``: with more ranks than CPUs, one
  CPU each, shared evenly (ranks 0 and 2 on the first of 2 CPUs, 1 and 3 on the second).

Run: ``python benchmarks/placement.py [--nproc 2] [--op broadcast] [--size 4K] [--rounds 12]
[--iters 2000] [--warmup 200] [--placements none,one-cpu,core,overload] [--compare mpi4py|none]``.
mpi4py and MPICH come with ``pip install -e '.[mpi]'``; ``--compare none`` runs ndist alone.
Everything comes from ``ndist.bench``'s public names: ``RankGroup`` (its ranks' results carry
``cpus``, ``mask`` and ``switches``) and ``rank_command``.
Not a test: timings depend on the machine; read the placement against the time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys

from ndist.bench import BenchError, RankGroup, parse_size, rank_command

PLACEMENTS = ("none", "one-cpu", "core", "overload")
NDIST = "ndist[socket]"  # the socket backend, as ndist-bench runs it
BIND = {"none": "none", "one-cpu": "none", "core": "core", "overload": "core:overload-allowed"}


def ndist_commands(placement: str, nproc: int):
    """``RankGroup(commands=...)`` for ndist's ranks under ndistrun, placed as ``placement`` says."""
    def commands(address: str) -> list[list[str]]:
        worker = rank_command(NDIST, "env", nproc, address)
        launch = [sys.executable, "-m", "ndist.launch", "--nproc-per-node", str(nproc),
                  "--bind-to", BIND[placement], *worker[1:]]
        if placement == "one-cpu":
            launch = ["taskset", "-c", str(min(os.sched_getaffinity(0))), *launch]
        return [launch]
    return commands


def one_setting(placement: str, args, request: dict) -> list[dict]:
    """Rounds of ndist (and ``--compare``), alternating; one record per round."""
    groups = {}
    try:
        groups[NDIST] = RankGroup(NDIST, args.nproc, args.timeout,
                                    commands=ndist_commands(placement, args.nproc)).start()
        if args.compare != "none":
            groups[args.compare] = RankGroup(args.compare, args.nproc, args.timeout).start()
        libs = list(groups)
        rounds = []
        for rnd in range(args.rounds):
            order = libs[rnd % len(libs):] + libs[:rnd % len(libs)]
            got = {lib: groups[lib].run(request) for lib in order}
            ranks = got[NDIST]
            rounds.append({
                "round": rnd, "first": "ndist" if order[0] == NDIST else order[0],
                "us": max(r["seconds"] for r in ranks) * 1e6,
                "other_us": (max(r["seconds"] for r in got[args.compare]) * 1e6) if args.compare != "none" else None,
                "cpus": [r["cpus"] for r in ranks],
                "masks": [r["mask"] for r in ranks],
                "switches": [sum(r["switches"]) for r in ranks],
            })
        for g in groups.values():
            g.stop()
        return rounds
    except BaseException:
        for g in groups.values():
            g.kill()
        raise


def shared(rec: dict) -> bool:
    """Every rank on one CPU, at both samples."""
    return len({c for cpus in rec["cpus"] for c in cpus}) == 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--op", default="broadcast")
    ap.add_argument("--size", default="4K")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--placements", default="none,one-cpu,core")
    ap.add_argument("--compare", default="mpi4py", choices=("mpi4py", "none"))
    ap.add_argument("--timeout", type=float, default=120.0)
    args = ap.parse_args(argv)
    placements = args.placements.split(",")
    bad = [p for p in placements if p not in PLACEMENTS]
    if bad:
        ap.error(f"--placements: expected a comma-separated list of {', '.join(PLACEMENTS)}, got {bad}")
    if "one-cpu" in placements and shutil.which("taskset") is None:
        ap.error("--placements one-cpu: needs taskset (util-linux)")
    request = {"op": args.op, "nbytes": parse_size(args.size), "dtype": "float32", "redop": "sum", "root": 0,
               "iters": args.iters, "warmup": args.warmup, "check": 0}
    cpus = sorted(os.sched_getaffinity(0))
    print(f"# {args.op} {args.size}, {args.nproc} ranks, {args.rounds} rounds of {args.iters} calls, "
          f"interleaved with {args.compare}; CPUs {cpus}; load {os.getloadavg()[0]:.2f}")
    other = f"{args.compare} us" if args.compare != "none" else ""
    print(f"{'placement':<9} {'round':>5} {'first':<7} {'ndist us':>9} {other:>10}  cpus (before>after, per rank)  "
          "switches/call")
    try:
        for placement in placements:
            rounds = one_setting(placement, args, request)
            for rec in rounds:
                where = "  ".join(f"{a}>{b}" for a, b in rec["cpus"])
                o = f"{rec['other_us']:10.1f}" if rec["other_us"] is not None else f"{'':>10}"
                print(f"{placement:<9} {rec['round']:>5} {rec['first']:<7} {rec['us']:9.1f} {o}  "
                      f"{where:<28}{' one CPU' if shared(rec) else '        '}  "
                      + " ".join(f"{s:.2f}" for s in rec["switches"]))
            one = [r["us"] for r in rounds if shared(r)]
            apart = [r["us"] for r in rounds if not shared(r)]
            med = lambda xs: f"{statistics.median(xs):.1f} us" if xs else "-"  # noqa: E731
            print(f"# {placement}: masks {sorted({tuple(m) for r in rounds for m in r['masks']})}; "
                  f"{len(one)} rounds with every rank on one CPU (median {med(one)}), "
                  f"{len(apart)} on different CPUs (median {med(apart)})")
    except BenchError as err:
        print(f"placement.py: {err}", file=sys.stderr)
        return 3
    print(f"# load at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
