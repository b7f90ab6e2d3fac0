"""The floor of the link between two "hosts": what moving an op's bytes between two network
namespaces joined by a veth pair costs with nothing but a TCP connection, no library.

    sudo python benchmarks/link_floor.py [--sizes 4K,64K,1M,16M] [--iters 20] [--warmup 5] [--rounds 5]

Two namespaces as in ``benchmarks/multihost.py`` (``ndist.testing.make_hosts``, no shaping), one
process in each (``ip netns exec``) running ``benchmarks/link_floor.c`` (built here with the
C compiler into a temporary folder), one TCP connection between them: ``TCP_NODELAY``,
socket buffers of ``--sockbuf`` (4 MiB, as ndist's TCP engine asks), non-blocking ``send``
and ``recv``, ``poll`` only when neither direction can move (the syscalls of ndist's TCP
engine, with no framing, no reduction and no interpreter). Per size, two patterns, timed
on host a from a start token to the last byte:

* ``one way``: a sends B bytes, b answers with one byte once they are in;
* ``both ways``: a and b send B bytes each at once, each taking in the other's as it comes.

At 2 hosts x 1 rank, with an op's size as ``ndist-bench`` counts it (nccl-tests' size: the
larger of a rank's send and receive bytes), the bytes each op must move between the hosts
are, at the least: broadcast S one way; all_reduce S each way (a reduce-scatter and an
all-gather, S/2 each); all_to_all, all_gather and reduce_scatter S/2 each way. Neither
direction goes faster than one way alone, so an op's floor is the one-way time of its bytes
per direction; the output gives it per op and size, to read against ``multihost.py
--compare`` rows of the same minutes: a library within 2x of the floor cannot be beaten 2x.
(The both-ways column is for information: it waits for both directions per transfer.)

Each round follows ``--warmup`` untimed transfers; per chunk size a cell is the median
over rounds of the mean per transfer, in µs. Needs root, iproute2 and a C compiler
(``CC``, default ``cc``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ndist.bench import parse_size
from ndist.testing import make_hosts

_SOURCE = Path(__file__).with_suffix(".c")


def build(folder: str) -> str:
    """Compile link_floor.c into ``folder``; returns the program's path."""
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise SystemExit(f"link_floor: no C compiler ({cc!r}; set CC)")
    exe = os.path.join(folder, "link_floor")
    r = subprocess.run([cc, "-O2", "-std=c11", "-Wall", "-o", exe, str(_SOURCE)], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"link_floor: {cc} failed:\n{r.stderr}")
    return exe


def measure(args, exe: str, hosts, chunk: int) -> dict:
    """Run both sides; returns {(bytes, both): [µs per round]}."""
    common = [str(args.sockbuf), str(chunk), str(args.iters), str(args.warmup), str(args.rounds), *map(str, args.plan_sizes)]
    server = subprocess.Popen(["ip", "netns", "exec", hosts.ns[1], exe, "serve", hosts.addr[1], *common],
                              stdout=subprocess.PIPE, text=True)
    try:
        port = server.stdout.readline().strip()
        if not port.isdigit():
            raise SystemExit(f"link_floor: host b's side did not start (said {port!r})")
        r = subprocess.run(["ip", "netns", "exec", hosts.ns[0], exe, "lead", hosts.addr[1], port, *common],
                           capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            raise SystemExit(f"link_floor: host a's side failed: {r.stderr.strip()}")
        if server.wait(60) != 0:
            raise SystemExit("link_floor: host b's side failed")
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    res = {}
    for line in r.stdout.splitlines():
        n, both, *rounds = line.split()
        res[(int(n), both == "1")] = [float(x) for x in rounds]
    return res


#: op -> the bytes it must move in each direction between 2 hosts x 1 rank, as a fraction of
#: its size (an all_reduce: a reduce-scatter and an all-gather, S/2 each way each)
_OPS = {"all_reduce": 1.0, "all_to_all": 0.5, "all_gather": 0.5, "reduce_scatter": 0.5, "broadcast": 1.0}


def report(args, runs: dict) -> str:
    """``runs``: {chunk: {(bytes, both): [µs per round]}}; each cell the lowest median over chunks."""
    meds = {chunk: {k: statistics.median(v) for k, v in res.items()} for chunk, res in runs.items()}
    med = {k: min(m[k] for m in meds.values()) for k in next(iter(meds.values()))}
    lines = [f"# link floor: 2 namespaces joined by a veth pair, one TCP connection (link_floor.c), "
             f"SO_SNDBUF/SO_RCVBUF {args.sockbuf or 'of the kernel'}",
             f"# {args.iters} transfers per round after {args.warmup} warm-up ones, {args.rounds} rounds; "
             f"median of rounds of the mean, µs per transfer; chunks {', '.join(map(str, runs))} "
             f"(0: no cap), each cell the lowest",
             f"# load average (1/5/15 min): {'/'.join(f'{x:.2f}' for x in os.getloadavg())} at end",
             "#", "# transfers", f"# {'bytes':>10} {'one way':>10} {'both ways':>10} {'one way GB/s':>13}"]
    for nbytes in args.plan_sizes:
        one, two = med[(nbytes, False)], med[(nbytes, True)]
        lines.append(f"  {nbytes:>10} {one:>10.1f} {two:>10.1f} {nbytes / one / 1e3:>13.2f}")
    lines += ["#", "# per chunk: one way / both ways, µs"]
    for chunk, m in meds.items():
        lines.append(f"# chunk {chunk:>8}: " + "  ".join(f"{n}: {m[(n, False)]:.1f} / {m[(n, True)]:.1f}"
                                                       for n in args.plan_sizes))
    lines += ["#", "# each op's floor at 2 hosts x 1 rank, µs: the one-way time of the bytes it must move in each",
              "# direction (neither direction goes faster than one way alone)",
              f"# {'bytes':>10} " + " ".join(f"{op:>14}" for op in _OPS)]
    for nbytes in args.sizes:
        cells = [f"{med[(int(nbytes * frac), False)]:>14.1f}" for frac in _OPS.values()]
        lines.append(f"  {nbytes:>10} " + " ".join(cells))
    return "\n".join(lines) + "\n"


def parse_sockbuf(text: str) -> int:
    return 0 if text in ("0", "") else parse_size(text, name="--sockbuf / --chunks")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="4K,64K,1M,16M", help="comma-separated sizes (K, M suffixes)")
    ap.add_argument("--iters", type=int, default=20, help="timed transfers per round")
    ap.add_argument("--warmup", type=int, default=5, help="untimed transfers per size and pattern")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per size and pattern (median)")
    ap.add_argument("--chunks", default="0,256K", help="the most one send/recv moves, one run each (0: no cap)")
    ap.add_argument("--sockbuf", type=parse_sockbuf, default="4M",
                    help="SO_SNDBUF and SO_RCVBUF of the connection (ndist's TCP engine asks 4M); 0: the kernel's")
    args = ap.parse_args(argv)
    if args.iters < 1 or args.rounds < 1 or args.warmup < 0:
        ap.error(f"iters and rounds >= 1, warmup >= 0; got {args.iters}, {args.rounds}, {args.warmup}")
    try:
        args.sizes = sorted({parse_size(x, name="--sizes") for x in args.sizes.split(",") if x})
        chunks = [parse_sockbuf(x) for x in args.chunks.split(",") if x]
    except ValueError as e:
        ap.error(str(e))
    if not args.sizes or not chunks:
        ap.error(f"--sizes, --chunks: expected comma lists of sizes; got {args.sizes!r}, {args.chunks!r}")
    args.plan_sizes = sorted(set(args.sizes) | {s // 2 for s in args.sizes if s >= 2})  # the ops' half sizes too
    if os.geteuid() != 0:
        raise SystemExit("link_floor: needs root (network namespaces)")

    def skip(reason):
        raise SystemExit(f"link_floor: {reason}")

    with tempfile.TemporaryDirectory(prefix="ndist-link-floor-") as tmp:
        exe = build(tmp)
        with make_hosts(2, skip) as hosts:  # on exit: the namespaces and every process in them are gone
            runs = {chunk: measure(args, exe, hosts, chunk) for chunk in chunks}
            used = hosts.ns[:2]
    sys.stdout.write(f"# command: link_floor.py {' '.join(sys.argv[1:] if argv is None else argv)}\n")
    sys.stdout.write(f"# namespaces (deleted): {' '.join(used)}\n")
    sys.stdout.write(report(args, runs))
    return 0


def _terminated(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds: the namespaces, their processes and the folder go


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminated)
    sys.exit(main())
