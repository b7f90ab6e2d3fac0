"""Instructions per repeated collective call, counted with callgrind (not timed).

    python benchmarks/call_counts.py                       # every config and op, a table
    python benchmarks/call_counts.py --configs socket2 --ops all_reduce --loop 500

A count of instructions does not depend on the machine's load, so it can be taken on
a shared machine where wall-clock times cannot. Each count is
(I(2N) - I(N)) / N: the same program run under callgrind with N and with 2N calls
of one op, so start-up, set-up and teardown cancel. Only the calls themselves are
collected: every worker makes its N calls inside ``map``'s ``next``
(``deque(map(lambda _: fn(), repeat(None, N)), 0)``) and callgrind runs with
``--collect-atstart=no --toggle-collect=map_next``; the ~800 instructions of that
loop and lambda are in every figure, raw mpi4py's too. Only the main thread's file
(``-01`` of ``--separate-threads=yes``) is read. 4 KiB float32 buffers.

Configs (``--configs``):

* ``api``: the public layer alone, world size 1, over a backend whose methods
  return at once (``api_overhead.py --loop``);
* ``mpi`` / ``raw``: ndist's mpi backend / mpi4py directly, world size 1 without
  ``mpiexec`` (``mpi_overhead.py --loop``): at one rank nothing is communicated;
* ``socket2-torch``: ``socket2`` with torch CPU tensors (``torch.from_numpy`` of the same
  buffers) passed to ndist's own API instead of NumPy arrays;
* ``socket2``: the socket backend's native engine at n = 2 on this host. Rank 0
  runs under callgrind and starts rank 1 (plain Python, not under callgrind). A
  rank that arrives first spins in the C engine's ``wait_ge`` (how long depends on
  the other rank, so on the load), so its cost is taken out: the count is the
  collected total minus ``wait_ge``'s inclusive cost (``callgrind_annotate
  --inclusive=yes``). Every spin and sleep of the native engine is inside
  ``wait_ge`` (the only caller of ``sched_yield`` and the futex wait; it is not
  inlined: ``nm`` lists it, and ``objdump -d`` shows its callers call it). What
  is left is the Python of the call, the argument handling of the C call, and the
  engine's own copy / reduce of 4 KiB, the same work whoever arrives first.

The ``all_to_all_single_uneven`` op passes split sizes (rank r sends r + 1 + q
elements to rank q; raw: ``Alltoallv``). ``--worker`` runs one config's loop (what
the driver runs under callgrind); nothing here reports a time.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import subprocess
import sys
import tempfile
from collections import deque
from itertools import repeat
from pathlib import Path

HERE = Path(__file__).resolve().parent
OPS = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
       "all_to_all_single_uneven")
CONFIGS = ("socket2", "socket2-torch", "api", "mpi", "raw")
WAIT_FN = "wait_ge"


# ----------------------------------------------------------------- workers
def _socket_worker(args) -> None:
    """One rank of the socket backend at n = 2 (rank 0 starts rank 1)."""
    peer = None
    path = args.init
    if args.rank == 0:
        path = tempfile.mktemp(prefix="ndist-call-counts-")
        env = dict(os.environ)
        env.setdefault("NDIST_SECRET", secrets.token_hex(16))
        os.environ.setdefault("NDIST_SECRET", env["NDIST_SECRET"])  # (a benchmark script, not the library)
        peer = subprocess.Popen([sys.executable, __file__, "--worker", "socket2", "--rank", "1", "--init", path,
                                 "--op", args.op, "--loop", str(args.loop), "--bytes", str(args.bytes),
                                 "--tensors", args.tensors], env=env)
    import ndist.distributed as dist

    dist.init_process_group("socket", init_method=f"file://{path}", rank=args.rank, world_size=2)
    try:
        # benchmarks/mpi_overhead.py, beside this script (sys.path[0]): the same buffers and closures
        from mpi_overhead import ndist_calls

        wrap = None
        if args.tensors == "torch":
            import torch

            wrap = torch.from_numpy
        fn = ndist_calls(dist, args.rank, 2, args.bytes, wrap)[args.op]
        for _ in range(20):
            fn()
        deque(map(lambda _: fn(), repeat(None, args.loop)), 0)
        dist.barrier()
    finally:
        dist.destroy_process_group()
        if peer is not None:
            peer.wait(timeout=120)
            try:
                os.unlink(path)
            except OSError:
                pass


# ----------------------------------------------------------------- driver
def _command(config: str, op: str, loop: int, nbytes: int) -> list[str]:
    py = sys.executable
    if config == "api":
        return [py, str(HERE / "api_overhead.py"), "--loop", str(loop), "--backend", "api", "--op", op,
                "--bytes", str(nbytes)]
    if config in ("mpi", "raw"):
        return [py, str(HERE / "mpi_overhead.py"), "--loop", str(loop), "--op", op, "--bytes", str(nbytes),
                "--side", "ndist" if config == "mpi" else "raw"]
    return [py, __file__, "--worker", "socket2", "--rank", "0", "--op", op, "--loop", str(loop),
            "--bytes", str(nbytes), "--tensors", "torch" if config == "socket2-torch" else "numpy"]


def _count(config: str, op: str, loop: int, nbytes: int, folder: str) -> int:
    """Instructions collected in the main thread, less ``wait_ge`` for socket2."""
    out = os.path.join(folder, f"cg-{config}-{op}-{loop}")
    cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--collect-atstart=no",
           "--toggle-collect=map_next", f"--callgrind-out-file={out}.%p", *_command(config, op, loop, nbytes)]
    env = dict(os.environ, PYTHONHASHSEED="0")
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if res.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    files = sorted(p for p in Path(folder).glob(Path(out).name + ".*-01"))
    if len(files) != 1:
        raise RuntimeError(f"expected one main-thread file for {out}, found {files}")
    text = files[0].read_text(errors="replace")
    m = re.search(r"^totals:\s+(\d+)", text, re.M) or re.search(r"^summary:\s+(\d+)", text, re.M)
    total = int(m.group(1))
    if config.startswith("socket2"):
        total -= _inclusive(files[0], WAIT_FN)
    for f in files:
        f.unlink()
    for f in Path(folder).glob(Path(out).name + ".*"):
        f.unlink()
    return total


def _inclusive(path: Path, fn: str) -> int:
    """``fn``'s inclusive instructions in a callgrind file (0 when it never ran collected)."""
    res = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(path)],
                         capture_output=True, text=True, check=True)
    for line in res.stdout.splitlines():
        m = re.match(r"\s*([\d,]+)\s.*[:\s]" + re.escape(fn) + r"(\s|\[|$)", line)
        if m:
            return int(m.group(1).replace(",", ""))
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--loop", type=int, default=500, help="N: each count runs N and 2N calls")
    parser.add_argument("--bytes", type=int, default=4096)
    parser.add_argument("--worker", choices=("socket2",), help="(internal) run one loop, no callgrind")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--init", default="")
    parser.add_argument("--op", default="all_reduce", choices=OPS)
    parser.add_argument("--tensors", default="numpy", choices=("numpy", "torch"), help="(internal) socket2's arrays")
    args = parser.parse_args()
    if args.worker:
        _socket_worker(args)
        return
    configs, ops = args.configs.split(","), args.ops.split(",")
    bad = [c for c in configs if c not in CONFIGS] + [o for o in ops if o not in OPS]
    if bad:  # before any worker starts under callgrind
        parser.error(f"--configs, --ops: expected names of {', '.join(CONFIGS)} and {', '.join(OPS)}; got {bad}")
    print(f"# instructions per call, (I(2N) - I(N)) / N, N = {args.loop}, {args.bytes} B float32; socket2 "
          f"without {WAIT_FN}")
    widths = [max(10, len(c) + 1) for c in configs]
    print(f"{'op':<26}" + "".join(f"{c:>{w}}" for c, w in zip(configs, widths)))
    with tempfile.TemporaryDirectory(prefix="ndist-cg-") as folder:
        for op in ops:
            row = []
            for config in configs:
                a = _count(config, op, args.loop, args.bytes, folder)
                b = _count(config, op, 2 * args.loop, args.bytes, folder)
                row.append((b - a) / args.loop)
            print(f"{op:<26}" + "".join(f"{v:>{w},.0f}" for v, w in zip(row, widths)), flush=True)


if __name__ == "__main__":
    main()
