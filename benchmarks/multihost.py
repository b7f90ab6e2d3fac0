"""all_reduce across "hosts": network namespaces with ``tc netem`` on their links,
the socket backend's two-level algorithms against the flat ones; or, with
``--compare``, ndist against MPICH and Gloo across the same hosts.

    sudo python benchmarks/multihost.py                       # 3 hosts x 2 ranks, 64K and 16M
    sudo python benchmarks/multihost.py --hosts 4 --per-host 4 --sizes 4K,64K,1M,16M \\
        --delay 0.5ms --rate 10gbit --iters 20 --warmup 5 --rounds 3
    sudo python benchmarks/multihost.py --compare mpi4py,torch --hosts 2 --per-host 2 \\
        --sizes 4K,64K,1M,16M --iters 20 --warmup 5 --rounds 5

H namespaces joined by a bridge (``ndist.testing.make_hosts``), ``tc netem
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

``--compare mpi4py,torch``: ndist against MPICH (mpi4py) and Gloo (torch) on the
same hosts, every op of ``--ops`` (default: all_reduce, all_to_all, all_gather,
reduce_scatter, broadcast) at every size, through ``ndist-bench``'s ranks and
runner (``ndist.bench``: the same adapters, timing, checks and interleaving).
Each library's H x R ranks are started once and stay up; for each op and size,
every round runs each library in turn (the first one rotates), and a cell is the
median over rounds of the slowest rank's mean µs per call. ndist and torch run
under ``ndistrun --nnodes H`` (one launcher per namespace; torch with
``GLOO_SOCKET_IFNAME`` = the namespace's interface); mpi4py under MPICH's
``mpiexec`` (Hydra) in host 0's namespace with ``-launcher ssh -launcher-exec``
a generated script that maps a host's address to its namespace and runs the
command there with ``ip netns exec``, and ``MPIR_CVAR_CH4_NETMOD=ucx
UCX_TLS=tcp,self`` (without ``UCX_TLS``, UCX sees one kernel and uses shared
memory between the namespaces). No shaping unless ``--delay`` / ``--rate`` are
given. TCP between the hosts runs the kernel's default congestion control unless
``--congestion NAME`` sets one on the namespaces' routes; the header names it, and per
library the TCP segments the hosts retransmitted during its calls (veth hands a packet to
the receive backlog of the CPU that sent it, so a flow sent from two CPUs can arrive out of
order, as it does under BBR's pacing here, and TCP retransmits: docs/performance.md). The ranks reach the driver over a Unix socket (a path crosses network
namespaces). Printed: per op, one row per size with each library's µs per call
and the ratios ndist/MPICH and ndist/Gloo; per library, the bytes its calls sent
over the hosts' links (a check that it did cross them) and where its ranks ran.
Exit status 1 when a result was wrong or a library's traffic did not cross the
links, 3 when a library failed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from ndist.bench import (MPI_LIBRARIES, OPS, STORE_HOST_ENV, BenchConfig, BenchError, RankGroup, find_mpiexec,
                         parse_size, rank_command, ratio_rows, run_bench, to_json)
from ndist.testing import launch_nodes, make_hosts, ndist_env, node_commands, outputs, wait_launchers

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


def _run(hosts, args, algo: str, folder: Path) -> list:
    folder.mkdir()
    job = folder / "job.py"
    job.write_text(textwrap.dedent(_JOB))
    result = folder / "result.json"
    sizes = ",".join(str(parse_size(s, name="--sizes")) for s in args.sizes.split(","))
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


# ------------------------------------------------------------------- --compare

COMPARE_OPS = "all_reduce,all_to_all,all_gather,reduce_scatter,broadcast"
COMPARE_LIBS = ("mpi4py", "torch", "torch:ndist")
NDIST = "ndist[socket]"
# MPICH between hosts: UCX over TCP (``self``: a rank to itself). Inside a host MPICH's own
# shared memory carries the traffic, as ndist's does.
MPICH_ENV = {"MPIR_CVAR_CH4_NETMOD": "ucx", "UCX_TLS": "tcp,self"}
# Bytes over the host links per byte of the calls' buffers below which a library's traffic
# did not cross them (every op moves at least half its buffer between hosts per call).
MIN_LINK_SHARE = 0.25
_SSH = """#!/bin/sh
# Hydra's "ssh" for network namespaces as hosts: [OPTIONS] HOST COMMAND...
# runs COMMAND (a shell command line, as ssh would) in HOST's namespace.
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
host=$1
shift
case "$host" in
{cases}
*) echo "no namespace for host $host" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" /bin/sh -c "$*"
"""


def write_ssh_script(hosts, folder: Path) -> Path:
    """The ``-launcher-exec`` of MPICH's Hydra: host address -> ``ip netns exec`` its namespace."""
    cases = "\n".join(f"{addr}) ns={ns} ;;" for addr, ns in zip(hosts.addr, hosts.ns))
    path = folder / "netns-ssh"
    path.write_text(_SSH.format(cases=cases))
    path.chmod(0o700)
    return path


def mpich_command(hosts, per_host: int, ssh: Path, worker: list) -> list:
    """``mpiexec`` (Hydra) in host 0's namespace: ``per_host`` ranks on each host's address,
    the hosts reached through ``ssh`` (``write_ssh_script``), UCX over TCP."""
    mpiexec = find_mpiexec()
    genv = [x for k, v in MPICH_ENV.items() for x in ("-genv", k, v)]
    return ["ip", "netns", "exec", hosts.ns[0], mpiexec, "-launcher", "ssh", "-launcher-exec", str(ssh),
            "-hosts", ",".join(hosts.addr), "-ppn", str(per_host), "-n", str(len(hosts.ns) * per_host), *genv,
            *worker]


class HostGroup(RankGroup):
    """One library's ranks on the hosts: ``RankGroup`` (start, requests, stop, kill), and
    the bytes the hosts' links sent while its requests ran (``link_bytes``, against
    ``buffer_bytes``: calls x bytes per call), read from the interfaces' counters, and the
    TCP segments the hosts sent and retransmitted meanwhile (``tcp_sent``, ``tcp_again``)."""

    def __init__(self, hosts, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.hosts = hosts
        self.link_bytes = 0
        self.buffer_bytes = 0
        self.tcp_sent = 0
        self.tcp_again = 0

    def per_buffer_byte(self) -> float:
        return self.link_bytes / self.buffer_bytes if self.buffer_bytes else 0.0

    def crossed(self) -> bool:
        """Whether its calls sent their data over the hosts' links: every op of ndist-bench
        moves at least half a buffer between two hosts per call (``MIN_LINK_SHARE``, with room)."""
        return self.per_buffer_byte() >= MIN_LINK_SHARE

    def run(self, request: dict) -> list:
        before, segs = self.hosts.link_bytes(), self.hosts.tcp_segments()
        out = super().run(request)
        self.link_bytes += self.hosts.link_bytes() - before
        after = self.hosts.tcp_segments()
        self.tcp_sent += after[0] - segs[0]
        self.tcp_again += after[1] - segs[1]
        self.buffer_bytes += request["nbytes"] * (request["warmup"] + request["iters"] + request["check"])
        return out


def _netns_of(pid: int) -> str:
    r = subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True, timeout=30)
    return r.stdout.strip() or "?"


def start_group(hosts, args, lib: str, folder: Path, ssh: Path, groups: dict) -> HostGroup:
    """``lib``'s ranks, ``args.per_host`` on each host, started (MPI through Hydra and ``ssh``,
    the others under ndistrun), listening on a Unix socket in ``folder``; rank r must run on
    host r // per_host (``BenchError`` otherwise). Added to ``groups``."""
    n = len(hosts.ns) * args.per_host
    sock = folder / f"g{len(groups)}.sock"

    def commands(address: str) -> list:
        worker = rank_command(lib, "env", n, address)
        if lib in MPI_LIBRARIES:
            return [mpich_command(hosts, args.per_host, ssh, worker)]
        node_env = [{STORE_HOST_ENV: hosts.addr[0], **({"GLOO_SOCKET_IFNAME": dev} if lib == "torch" else {})}
                    for dev in hosts.veth]
        return node_commands(hosts, args.per_host, worker[1:], node_env=node_env)  # ndistrun -m ...

    group = HostGroup(hosts, lib, n, args.timeout, commands=commands, listen=str(sock)).start()
    try:
        for r, info in sorted(group.ranks.items()):
            info["netns"] = _netns_of(info["pid"])
            if info["netns"] != hosts.ns[r // args.per_host]:
                raise BenchError(f"{lib}: rank {r} (pid {info['pid']}) runs in namespace {info['netns']}, "
                                 f"expected {hosts.ns[r // args.per_host]}")
    except BaseException:
        group.kill()
        raise
    groups[lib] = group
    return group


def _us(v) -> str:
    return f"{v:10.1f}" if v >= 100 else f"{v:10.2f}"


def _ratio(v) -> str:
    return f"{v:>9.2f}x" if v is not None else f"{'n/a':>10}"


_LABEL = {NDIST: "ndist", "mpi4py": "MPICH", "torch": "Gloo", "torch:ndist": "torch:ndist"}


def report_compare(res, groups: dict, hosts, args, shaping: str, congestion: str) -> str:
    cfg = res.config
    libs = cfg.libraries
    out = [f"# multihost --compare: {len(hosts.ns)} hosts x {args.per_host} ranks (network namespaces), "
           f"host links: {shaping}, TCP congestion control {congestion}, {cfg.dtype} {cfg.redop}",
           f"# {cfg.iters} calls per round after {cfg.warmup} warm-up calls, {cfg.rounds} rounds alternated "
           f"between libraries, median of rounds of the slowest rank's mean; us per call",
           f"# load average (1/5/15 min): {'/'.join(map(str, res.load[0]))} at start, "
           f"{'/'.join(map(str, res.load[1]))} at end"]
    for lib in libs:
        g = groups.get(lib)
        vs = "  ".join(f"{k} {v}" for k, v in res.versions.get(lib, {}).items())
        out.append(f"#  {lib:<13} {vs}")
        if lib in MPI_LIBRARIES:
            out.append(f"#  {'':<13} mpiexec (Hydra) -launcher ssh -launcher-exec <ip netns exec script>, "
                       + " ".join(f"{k}={v}" for k, v in MPICH_ENV.items()))
        elif lib == "torch":
            out.append(f"#  {'':<13} ndistrun --nnodes {len(hosts.ns)}, GLOO_SOCKET_IFNAME=<the namespace's veth>")
        else:
            out.append(f"#  {'':<13} ndistrun --nnodes {len(hosts.ns)}")
        if g is not None:
            placed = ", ".join(f"{r}:{info.get('netns', '?').rsplit('-', 1)[-1]}"
                               for r, info in sorted(g.ranks.items()))
            out.append(f"#  {'':<13} ranks on hosts {placed}; host links carried {g.link_bytes / 2**20:.1f} MiB "
                       f"during its calls ({g.per_buffer_byte():.2f} bytes per buffer byte); TCP retransmitted "
                       f"{g.tcp_again} of {g.tcp_sent} segments")
            if not g.crossed():
                out.append(f"#  {'':<13} WARNING: less than {MIN_LINK_SHARE} bytes per buffer byte crossed the host "
                           "links: its ranks did not talk over the network (shared memory between namespaces?)")
    subjects = [lib for lib in libs if lib == NDIST]
    pairs = [f"{NDIST}/{lib}" for lib in libs if lib not in subjects] if subjects else []
    for op in cfg.ops:
        by = {(r.lib, r.size): r for r in res.rows if r.op == op}
        ratios = {r["size"]: r for r in ratio_rows(res, op)}
        out.append("#")
        out.append(f"# {op}")
        head = f"# {'bytes':>10}" + "".join(f" {_LABEL.get(lib, lib):>10}" for lib in libs)
        head += "".join(f" {'ndist/' + _LABEL.get(p.split('/', 1)[1], p):>10}" for p in pairs) + "  wrong"
        out.append(head)
        for size in sorted({r.size for r in res.rows if r.op == op}):
            line = f"  {size:>10}" + "".join(_us(by[(lib, size)].time_us) if (lib, size) in by else f" {'-':>10}"
                                             for lib in libs)
            line += "".join(" " + _ratio(ratios.get(size, {}).get(p, {}).get("time")) for p in pairs)
            wrong = [by[(lib, size)].wrong for lib in libs if (lib, size) in by]
            line += "  " + ("/".join(str(w) for w in wrong) if any(w != 0 for w in wrong) else "0")
            out.append(line)
    rows = len(res.rows)
    bad = sum(max(r.wrong, 0) for r in res.rows)
    unchecked = sum(r.wrong < 0 for r in res.rows)
    out.append("#")
    out.append(f"# checked: {rows} cells, {bad} wrong elements" + (f", {unchecked} not checked" if unchecked else ""))
    return "\n".join(out) + "\n"


def run_compare(args) -> int:
    libs = tuple(x for x in args.compare.split(",") if x)
    bad = [x for x in libs if x not in COMPARE_LIBS]
    if bad or not libs:
        raise SystemExit(f"multihost: --compare: expected a comma list of {', '.join(COMPARE_LIBS)}; "
                         f"got {args.compare!r}")
    ops = tuple(x for x in args.ops.split(",") if x)
    if any(o not in OPS for o in ops):
        raise SystemExit(f"multihost: --ops: expected ops of ndist-bench ({', '.join(OPS)}); got {args.ops!r}")
    cfg = BenchConfig(ops=ops, sizes=tuple(parse_size(x, name="--sizes") for x in args.sizes.split(",")), iters=args.iters,
                      warmup=args.warmup, check=args.check, nproc=args.hosts * args.per_host,
                      backends=("socket",), compare=libs, rounds=args.rounds, timeout=args.timeout, quiet=True)

    def skip(reason):
        raise SystemExit(f"multihost: {reason}")

    groups: dict = {}
    with make_hosts(args.hosts, skip) as hosts, tempfile.TemporaryDirectory(prefix="ndist-multihost-") as tmp:
        shaping = hosts.shape(args.delay, args.rate)
        congestion = hosts.congestion(args.congestion)
        ssh = write_ssh_script(hosts, Path(tmp))
        try:
            res = run_bench(cfg, start=lambda lib: start_group(hosts, args, lib, Path(tmp), ssh, groups))
        except (BenchError, ValueError) as e:
            sys.stderr.write(f"multihost: {e}\n")
            return 3
        text = report_compare(res, groups, hosts, args, shaping, congestion)
        if args.json:
            doc = json.loads(to_json(res, ["multihost.py", *sys.argv[1:]]))
            doc["hosts"] = {"count": args.hosts, "per_host": args.per_host, "namespaces": hosts.ns,
                            "addresses": hosts.addr, "shaping": shaping, "congestion": congestion}
            doc["link_bytes"] = {lib: {"link": g.link_bytes, "buffers": g.buffer_bytes} for lib, g in groups.items()}
            doc["tcp_segments"] = {lib: {"sent": g.tcp_sent, "retransmitted": g.tcp_again} for lib, g in groups.items()}
            Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    sys.stdout.write(text)
    return 1 if any(r.wrong > 0 for r in res.rows) or not all(g.crossed() for g in groups.values()) else 0


def run_algos(args) -> int:
    def skip(reason):
        raise SystemExit(f"multihost: {reason}")

    algos = args.algos.split(",")
    with make_hosts(args.hosts, skip) as hosts, tempfile.TemporaryDirectory() as tmp:
        shaping = hosts.shape(args.delay, args.rate)
        congestion = hosts.congestion(args.congestion)
        results = {a: _run(hosts, args, a, Path(tmp) / a) for a in algos}
    print(f"# multihost: {args.hosts} hosts x {args.per_host} ranks, {shaping} on every host link, "
          f"TCP congestion control {congestion}, "
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=None, help="hosts (namespaces); default 3, with --compare 2")
    ap.add_argument("--per-host", type=int, default=None, help="ranks per host; default 2, with --compare 1")
    ap.add_argument("--sizes", default=None, help="comma-separated byte sizes (K, M suffixes); default 64K,16M, "
                                                  "with --compare 4K,64K,1M,16M")
    ap.add_argument("--delay", default=None, help="netem delay on every host's link (each way); default 1ms, "
                                                  "with --compare none")
    ap.add_argument("--rate", default=None, help="netem rate on every host's link; default 1gbit, with --compare none")
    ap.add_argument("--congestion", default=None, metavar="NAME",
                    help="TCP congestion control between the hosts (e.g. cubic, bbr; set on the namespaces' "
                         "routes); default: the kernel's")
    ap.add_argument("--warmup", type=int, default=None, help="untimed calls per size; default 3, with --compare 5")
    ap.add_argument("--iters", type=int, default=None, help="timed calls per round; default 10, with --compare 20")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per size (median); default 3, with --compare 5")
    ap.add_argument("--algos", default="auto,flat", help="NDIST_ALGO values to compare (without --compare)")
    ap.add_argument("--compare", default=None, metavar="LIBS",
                    help=f"ndist against these libraries instead, on every op of --ops: {', '.join(COMPARE_LIBS)}")
    ap.add_argument("--ops", default=COMPARE_OPS, help="with --compare: ndist-bench's ops, comma separated")
    ap.add_argument("--check", type=int, default=1, help="with --compare: result checks per size (0: off)")
    ap.add_argument("--json", default=None, metavar="PATH", help="with --compare: write the results as JSON")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds per job (with --compare: per library and size)")
    args = ap.parse_args(argv)
    compare = args.compare is not None
    defaults = {"hosts": (3, 2), "per_host": (2, 1), "sizes": ("64K,16M", "4K,64K,1M,16M"),
                "delay": ("1ms", None), "rate": ("1gbit", None), "warmup": (3, 5), "iters": (10, 20),
                "rounds": (3, 5)}
    for name, pair in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, pair[compare])
    for name in ("delay", "rate"):
        if getattr(args, name) in ("none", "0", ""):
            setattr(args, name, None)
    offered = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")
    if args.congestion is not None and offered.exists() and args.congestion not in offered.read_text().split():
        ap.error(f"--congestion: expected one of the kernel's TCP congestion controls "
                 f"({', '.join(offered.read_text().split())}); got {args.congestion!r}")
    if args.hosts < 2 or args.per_host < 1 or args.iters < 1 or args.rounds < 1:
        ap.error(f"hosts >= 2, per-host, iters and rounds >= 1; got {args.hosts}, {args.per_host}, {args.iters}, "
                 f"{args.rounds}")
    return run_compare(args) if compare else run_algos(args)


def _terminated(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds: the ranks are killed, the namespaces removed


if __name__ == "__main__":
    if os.geteuid() != 0:
        raise SystemExit("multihost: needs root (network namespaces, tc)")
    signal.signal(signal.SIGTERM, _terminated)
    sys.exit(main())
