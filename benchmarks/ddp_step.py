"""The time of one DDP training step, torch.distributed on Gloo against backend "ndist".

    python benchmarks/ddp_step.py [--nproc 2] [--mb 25] [--steps 20] [--warmup 3]
                                  [--backends gloo,ndist] [--bucket-cap-mb 25] [--batch 8]

The model is a stack of 1024x1024 linear layers with about ``--mb`` MiB of float32
gradients (25 MiB: 6 layers, 6.3 M parameters); the batch is small, so a step is
mostly DDP's gradient all-reduces (one per bucket of ``--bucket-cap-mb``, DDP's
default 25). Each backend runs ``--nproc`` fresh processes (spawned; they meet
through a FileStore in a temporary folder, so no port is involved), with one
thread each. A step is forward + backward + SGD; the slowest rank's time counts.
Prints, per backend, the median and the minimum over ``--steps`` steps after
``--warmup`` untimed ones, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from datetime import timedelta

WIDTH = 1024


def _rank(rank, nproc, backend, path, args, queue):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if backend == "ndist":
        import ndist.torch  # noqa: F401 - registers the backend

    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"file://{path}", rank=rank, world_size=nproc,
                            timeout=timedelta(seconds=300))
    layers = max(1, round(args.mb * (1 << 20) / 4 / (WIDTH * (WIDTH + 1))))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)])
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    x = torch.randn(args.batch, WIDTH, generator=torch.Generator().manual_seed(rank))
    times = []
    for i in range(args.warmup + args.steps):
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        ddp(x).pow(2).mean().backward()
        opt.step()
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's step
        if i >= args.warmup:
            times.append(t.item())
    dist.destroy_process_group()
    if rank == 0:
        queue.put((grad_bytes, times))


def run(backend: str, args) -> tuple[int, list[float]]:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "store")
        procs = [ctx.Process(target=_rank, args=(r, args.nproc, backend, path, args, queue))
                 for r in range(args.nproc)]
        for p in procs:
            p.start()
        try:
            result = queue.get(timeout=args.timeout)
        finally:
            for p in procs:
                p.join(30)
                if p.is_alive():
                    p.kill()
                    p.join()
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        raise RuntimeError(f"{backend}: ranks exited with {bad}")
    return result


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--mb", type=float, default=25.0, help="MiB of gradients (default 25)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    ap.add_argument("--backends", default="gloo,ndist")
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args(argv)
    medians = {}
    print(f"# DDP step, {args.nproc} ranks, bucket_cap_mb={args.bucket_cap_mb:g}, batch {args.batch}, "
          f"{os.cpu_count()} cores")
    print(f"# {'backend':>8} {'grad MiB':>9} {'median ms':>10} {'min ms':>8} {'steps':>6}")
    for backend in args.backends.split(","):
        grad_bytes, times = run(backend, args)
        medians[backend] = statistics.median(times)
        print(f"  {backend:>8} {grad_bytes / (1 << 20):9.1f} {medians[backend] * 1e3:10.2f} "
              f"{min(times) * 1e3:8.2f} {len(times):6d}")
    if "gloo" in medians and "ndist" in medians:
        print(f"# gloo / ndist (median): {medians['gloo'] / medians['ndist']:.2f}x")


if __name__ == "__main__":
    main()
