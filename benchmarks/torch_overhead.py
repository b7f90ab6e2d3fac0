"""What torch's layer costs per collective call, counted in instructions (callgrind).

    python benchmarks/torch_overhead.py --count --side floor,ndist,direct,direct-tensor

runs this script under ``valgrind --tool=callgrind`` once per side and prints, per op,
the instructions per call of the main thread: each op is called N times, then 2N
times (``--loop N``, default 200) on float32 tensors of ``--bytes`` (64 KiB), and
per call = (I(2N) - I(N)) / N, so warm-up and fixed costs cancel. Only what runs
inside ``itertools.starmap``'s next is counted (``--toggle-collect=starmap_next``),
and each ``math.lcm()`` call dumps the counts (``--dump-before=math_lcm``), so one
run counts every op. ``PYTHONHASHSEED=0``. Counts, not times: they do not depend on
the machine's load (on the 2-vCPU VM of docs/performance.md, about 11,300 instructions per µs).

``--side`` picks what is called:

* ``floor``: torch.distributed's public function on backend ``"bench-noop"``, a Python
  ProcessGroup registered by this script whose methods return an already completed
  Work and move no data: what torch itself costs a Python-implemented backend;
* ``ndist``: torch.distributed's public function on backend ``"ndist"`` (``ndist.torch``);
* ``direct``: ``ndist.distributed``'s function on NumPy views of the same tensors, on
  the ndist group underneath the torch group (what ndist costs without torch);
* ``direct-tensor``: the same on the torch tensors themselves.

Ops: ``all_reduce``, ``broadcast``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``,
``all_to_all_single`` (even splits) and ``all_to_all_single_uneven`` (split sizes
given, a different one per peer); ``--op`` picks one (default: all).

World size 1 by default (a HashStore; nothing is communicated). ``--world 2`` starts
a second, uncounted rank beside the counted one (a FileStore in a temporary folder)
and leaves the native engine's waits for the peer out of the count (nested
``--toggle-collect`` on its wait functions). Without ``--count`` the script makes
the calls of one side and nothing else (what ``--count`` runs under valgrind).
"""

from __future__ import annotations

import argparse
from collections import deque
from datetime import timedelta
from itertools import repeat, starmap

OPS = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
       "all_to_all_single_uneven")
NOOP = "bench-noop"
SIDES = ("floor", "ndist", "direct", "direct-tensor")


def _register_noop() -> None:
    import torch.distributed as tdist

    class DoneWork(tdist.Work):
        """Complete when made; its future (when asked) holds the outputs."""

        def __init__(self, outputs) -> None:
            super().__init__()
            self._outputs = outputs

        def wait(self, timeout=None) -> bool:
            return True

        def is_completed(self) -> bool:
            return True

        def get_future(self):
            import torch

            fut = torch.futures.Future()
            fut.set_result(self._outputs)
            return fut

    class NoopGroup(tdist.ProcessGroup):
        """Moves nothing: what is left of a call's cost is torch's."""

        def getBackendName(self) -> str:  # noqa: N802 - torch's name
            return NOOP

        def allreduce(self, tensors, opts=None):
            return DoneWork(tensors)

        def broadcast(self, tensors, opts=None):
            return DoneWork(tensors)

        # the names torch 2.13's public functions call (all_gather_into_tensor ->
        # all_gather_single, reduce_scatter_tensor -> reduce_scatter_single)
        def all_gather_single(self, output, input, opts=None):  # noqa: A002 - torch's names
            return DoneWork([output])

        def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002
            return DoneWork([output])

        def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: A002
            return DoneWork([output])

        def barrier(self, opts=None):
            return DoneWork([])

    def create(dist_opts, pg_options=None):
        return NoopGroup(dist_opts.group_rank, dist_opts.group_size)

    tdist.Backend.register_backend(NOOP, create, extended_api=True, devices=["cpu"])


def _tensors(rank: int, world: int, nbytes: int) -> dict:
    import torch

    n = max(nbytes // 4 // world, world) * world
    k = n // world
    # uneven: rank r sends k + r - q elements to rank q and receives k + q - r from it
    ins = [k + rank - q for q in range(world)]
    outs = [k + q - rank for q in range(world)]
    return dict(full=torch.ones(n), out=torch.empty(n), part=torch.ones(k), part_out=torch.empty(k),
                uin=torch.ones(sum(ins)), uout=torch.empty(sum(outs)), ins=ins, outs=outs)


def _torch_calls(b: dict) -> dict:
    import torch.distributed as dist

    return {
        "all_reduce": lambda: dist.all_reduce(b["full"]),
        "broadcast": lambda: dist.broadcast(b["full"], 0),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(b["out"], b["part"]),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(b["part_out"], b["full"]),
        "all_to_all_single": lambda: dist.all_to_all_single(b["out"], b["full"]),
        "all_to_all_single_uneven": lambda: dist.all_to_all_single(b["uout"], b["uin"], b["outs"], b["ins"]),
    }


def _direct_calls(b: dict, group, numpy: bool) -> dict:
    import ndist.distributed as nd

    if numpy:
        b = {k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in b.items()}
    g = group
    return {
        "all_reduce": lambda: nd.all_reduce(b["full"], group=g),
        "broadcast": lambda: nd.broadcast(b["full"], 0, group=g),
        "all_gather_into_tensor": lambda: nd.all_gather_into_tensor(b["out"], b["part"], group=g),
        "reduce_scatter_tensor": lambda: nd.reduce_scatter_tensor(b["part_out"], b["full"], group=g),
        "all_to_all_single": lambda: nd.all_to_all_single(b["out"], b["full"], group=g),
        "all_to_all_single_uneven": lambda: nd.all_to_all_single(b["uout"], b["uin"], b["outs"], b["ins"],
                                                                 group=g),
    }


def _count(args, sides) -> None:
    """Run this script under callgrind (rank 0; a plain rank 1 beside it when --world 2)
    and print instructions per call, per side and op."""
    import os
    import subprocess
    import sys
    import tempfile

    ops = OPS if args.op == "all" else (args.op,)
    rows = {}
    for side in sides:
        with tempfile.TemporaryDirectory(prefix="ndist-torch-overhead-") as tmp:
            base = [sys.executable, os.path.abspath(__file__), "--loop", str(args.loop), "--op", args.op,
                    "--side", side, "--bytes", str(args.bytes), "--world", str(args.world)]
            if args.world > 1:
                base += ["--store-file", os.path.join(tmp, "store")]
            vg = ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--collect-atstart=no",
                  "--toggle-collect=starmap_next", "--dump-before=math_lcm",
                  f"--callgrind-out-file={tmp}/cg.%p"]
            if args.world > 1:  # the native engine's waits for the peer are not counted
                vg += ["--toggle-collect=wait_ge", "--toggle-collect=wait_check", "--toggle-collect=futex_wait"]
            env = dict(os.environ, PYTHONHASHSEED="0")
            peers = [subprocess.Popen(base + ["--rank", str(r)], env=env) for r in range(1, args.world)]
            subprocess.run(vg + base + ["--rank", "0"], env=env, check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            for p in peers:
                p.wait()
            totals = {}
            for name in os.listdir(tmp):  # cg.PID.DUMP-THREAD; the main thread is -01
                if name.startswith("cg.") and name.endswith("-01") and name.count(".") == 2:
                    dump = int(name.split(".")[2].split("-")[0])
                    with open(os.path.join(tmp, name)) as f:
                        totals[dump] = next(int(line.split()[1]) for line in f if line.startswith("totals:"))
        # dump 1: before the first op; then two per op (N calls, 2N calls)
        for i, op in enumerate(ops):
            rows.setdefault(op, {})[side] = (totals[3 + 2 * i] - totals[2 + 2 * i]) / args.loop
    print(f"# instructions per call (callgrind, main thread, (I(2N) - I(N)) / N, N = {args.loop}), "
          f"{args.bytes} bytes, world size {args.world}")
    print(f"{'op':<26}" + "".join(f"{s:>15}" for s in sides))
    for op, by in rows.items():
        print(f"{op:<26}" + "".join(f"{by[s]:>15,.0f}" for s in sides))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", type=int, default=200, help="N: each op makes N calls, then 2N (counted)")
    parser.add_argument("--op", default="all", choices=("all",) + OPS)
    parser.add_argument("--side", default="ndist", help="floor, ndist, direct or direct-tensor; "
                        "with --count a comma-separated list")
    parser.add_argument("--count", action="store_true", help="run under callgrind and print the counts")
    parser.add_argument("--bytes", type=int, default=65536, help="the full tensor's size")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--store-file", help="a FileStore path shared by the ranks (--world > 1)")
    args = parser.parse_args()
    sides = args.side.split(",")
    if any(s not in SIDES for s in sides):
        parser.error(f"--side: expected some of {list(SIDES)}, got {args.side!r}")
    if args.count:
        _count(args, sides)
        return
    if len(sides) != 1:
        parser.error("--side: one side without --count")
    side = sides[0]

    import math
    import warnings

    import torch
    import torch.distributed as dist

    import ndist.torch  # noqa: F401 - registers "ndist"

    warnings.simplefilter("ignore", FutureWarning)
    torch.set_num_threads(1)
    if side == "floor":
        _register_noop()
    backend = NOOP if side == "floor" else "ndist"
    if args.world > 1:
        if not args.store_file:
            parser.error("--world > 1 needs --store-file")
        store = dist.FileStore(args.store_file, args.world)
    else:
        store = dist.HashStore()
    dist.init_process_group(backend, store=store, rank=args.rank, world_size=args.world,
                            timeout=timedelta(seconds=600))
    b = _tensors(args.rank, args.world, args.bytes)
    if side in ("floor", "ndist"):
        calls = _torch_calls(b)
    else:
        group = dist.distributed_c10d._get_default_group().ndist_group
        calls = _direct_calls(b, group, side == "direct")

    def call(fn):
        fn()

    # Counted: only what runs inside starmap's next (--toggle-collect=starmap_next);
    # math.lcm() marks a boundary (--dump-before=math_lcm): the calls since the last one.
    math.lcm()
    for op in OPS if args.op == "all" else (args.op,):
        fn = calls[op]
        for _ in range(args.warmup):
            fn()
        for n in (args.loop, 2 * args.loop):
            deque(starmap(call, repeat((fn,), n)), 0)
            math.lcm()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
