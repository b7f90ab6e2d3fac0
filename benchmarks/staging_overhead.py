"""What host staging costs: the socket backend's all_reduce of CUDA arrays at 2 ranks
against the same all_reduce of host arrays plus ``cudaMemcpy`` both ways.

``HostStagingBackend`` (``ndist/collectives/_staging.py``) copies a CUDA array into a
pinned host buffer, runs the CPU backend on it and copies the result back. Its floor is
therefore the host all_reduce plus one device-to-host and one host-to-device
``cudaMemcpy`` of the buffer. Per size, with 2 ranks (processes sharing GPU 0):

* ``host``: the socket backend's all_reduce of a NumPy array (median per call, max over ranks);
* ``staged``: the same all_reduce of a CuPy array through ``HostStagingBackend``;
* ``d2h`` / ``h2d``: ``cudaMemcpy`` of the buffer to / from pinned host memory (rank 0,
  while rank 1 waits);
* ``staged / (host + d2h + h2d)``: 1.0 means staging runs at ``cudaMemcpy`` speed.

Every staged result is checked against the expected sum. The staged call is blocking
(``async_op=False``), so it is pipelined in chunks (``_staging_plan.py``). Target (issue 46):
``staged / (host + d2h + h2d) <= 1.0`` at every size from 1 MiB; a line ``# target: ...``
says whether it was met (the exit status and ``# OK`` are about correctness only).

Usage (on a GPU machine, from the repository root):

    python benchmarks/staging_overhead.py [--sizes 1M,4M,16M,64M] [--iters 10] [--json out.json]

``--device numpy`` runs the very same code with NumPy arrays in the device role
(``HostArrays``, copies are memcpys): a check of the benchmark itself on a machine without
a GPU, whose numbers mean nothing. With ``--device cuda`` (the default) and no CuPy or
GPU it prints one line starting with ``skipped:`` and exits 0.
Exit status 0; 1 when a staged result was wrong.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from ndist.bench import parse_size


def _skip_reason() -> str | None:
    try:
        import cupy
    except ImportError as err:
        return f"CuPy is not installed ({err})"
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            return "no CUDA device"
    except Exception as err:  # noqa: BLE001 - cudaErrorNoDevice, no driver, ...
        return f"no usable CUDA device ({err})"
    return None


class _Cuda:
    """The device side on a GPU: CuPy arrays, cudaMemcpy to and from pinned memory."""

    name = "cuda"

    def __init__(self):
        import cupy

        from ndist.collectives._staging import CupyArrays

        self.cp = cupy
        self.arrays = CupyArrays()

    def full(self, n, value):
        return self.cp.full(n, value, dtype=self.cp.float32)

    def pinned(self, nbytes):
        import numpy as np

        mem = self.cp.cuda.alloc_pinned_memory(nbytes)
        return np.frombuffer(mem, dtype="uint8", count=nbytes), mem

    def sync(self):
        self.cp.cuda.get_current_stream().synchronize()

    def memcpy_s(self, dev, host, to_host: bool, iters: int) -> float:
        rt = self.cp.cuda.runtime
        kind = rt.memcpyDeviceToHost if to_host else rt.memcpyHostToDevice
        dptr, hptr = dev.data.ptr, host.ctypes.data
        args = (hptr, dptr) if to_host else (dptr, hptr)
        times = []
        for _ in range(iters + 1):
            t0 = time.perf_counter()
            rt.memcpy(*args, dev.nbytes, kind)
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])

    def all_equal(self, dev, value) -> bool:
        return bool((dev == value).all())


class _Numpy:
    """NumPy in the device role (``HostArrays``): checks the benchmark on a CPU-only machine."""

    name = "numpy"

    def __init__(self):
        import numpy as np

        from ndist.collectives._staging import HostArrays

        self.np = np
        self.arrays = HostArrays()

    def full(self, n, value):
        return self.np.full(n, value, dtype=self.np.float32)

    def pinned(self, nbytes):
        return self.np.empty(nbytes, dtype="uint8"), None

    def sync(self):
        pass

    def memcpy_s(self, dev, host, to_host: bool, iters: int) -> float:
        src, dst = (dev.view("uint8"), host) if to_host else (host, dev.view("uint8"))
        times = []
        for _ in range(iters + 1):
            t0 = time.perf_counter()
            self.np.copyto(dst, src)
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])

    def all_equal(self, dev, value) -> bool:
        return bool((dev == value).all())


def _rank(rank, world_size, device, sizes, iters, warmup, timeout):
    import numpy as np

    import ndist.distributed as dist
    from ndist.collectives import Call, Op, ReduceOp
    from ndist.collectives._staging import HostStagingBackend
    from ndist.runtime import resolve_group

    side = _Cuda() if device == "cuda" else _Numpy()
    inner = resolve_group(None).backend_for("cpu")
    staged = HostStagingBackend(inner, side.arrays)
    expected = float(world_size * (world_size + 1) // 2)
    rows = []

    def timed(backend, call, reset):
        times = []
        for i in range(warmup + iters):
            reset()
            side.sync()
            dist.barrier()
            t0 = time.perf_counter()
            backend.all_reduce(call, blocking=True).wait(timeout)
            side.sync()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    for size in sizes:
        n = size // 4
        host = np.full(n, rank + 1, dtype=np.float32)
        t_host = timed(inner, Call(Op.ALL_REDUCE, "cpu", host.dtype, out=host, redop=ReduceOp.SUM),
                       lambda host=host: host.fill(rank + 1))
        dev = side.full(n, rank + 1)
        t_staged = timed(staged, Call(Op.ALL_REDUCE, "cuda", host.dtype, out=dev, redop=ReduceOp.SUM),
                         lambda dev=dev: dev.fill(rank + 1))
        dev.fill(rank + 1)
        staged.all_reduce(Call(Op.ALL_REDUCE, "cuda", host.dtype, out=dev, redop=ReduceOp.SUM),
                          blocking=True).wait(timeout)
        side.sync()
        ok = side.all_equal(dev, expected)
        d2h = h2d = None
        dist.barrier()
        if rank == 0:
            buf, keep = side.pinned(size)
            d2h = side.memcpy_s(dev, buf, True, iters)
            h2d = side.memcpy_s(dev, buf, False, iters)
            del buf, keep
        dist.barrier()
        rows.append({"bytes": n * 4, "host_s": t_host, "staged_s": t_staged, "d2h_s": d2h, "h2d_s": h2d, "ok": ok})
        del host, dev
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1M,4M,16M,64M", help="buffer sizes in bytes (K/M/G suffixes)")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2, help="ranks (processes sharing GPU 0). Default 2")
    parser.add_argument("--device", choices=("cuda", "numpy"), default="cuda",
                        help="numpy: NumPy in the device role, to check the benchmark without a GPU")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds the whole run may take")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.device == "cuda":
        reason = _skip_reason()
        if reason is not None:
            print(f"skipped: {reason}")
            return 0
    sizes = [parse_size(s, name="--sizes") for s in args.sizes.split(",")]

    from ndist.testing import run_ranks

    per_rank = run_ranks(_rank, args.nproc, args=(args.device, sizes, args.iters, args.warmup, args.timeout),
                         backend="socket", timeout=args.timeout)
    rows, ok = [], True
    print(f"# socket all_reduce, {args.nproc} ranks, float32, device {args.device}; times are medians, max over ranks")
    print(f"{'bytes':>11} {'host us':>10} {'staged us':>10} {'d2h us':>9} {'h2d us':>9} {'d2h GB/s':>9} "
          f"{'h2d GB/s':>9} {'staged/(host+d2h+h2d)':>22} {'ok':>3}")
    for i, size in enumerate(sizes):
        mine = [r[i] for r in per_rank]
        host, staged = max(m["host_s"] for m in mine), max(m["staged_s"] for m in mine)
        d2h, h2d = mine[0]["d2h_s"], mine[0]["h2d_s"]
        good = all(m["ok"] for m in mine)
        ok &= good
        nbytes = mine[0]["bytes"]
        floor = host + d2h + h2d
        rows.append({"bytes": nbytes, "host_s": host, "staged_s": staged, "d2h_s": d2h, "h2d_s": h2d,
                     "d2h_GBps": nbytes / d2h / 1e9, "h2d_GBps": nbytes / h2d / 1e9,
                     "staged_over_floor": staged / floor, "ok": good})
        print(f"{nbytes:>11} {host * 1e6:>10.1f} {staged * 1e6:>10.1f} {d2h * 1e6:>9.1f} {h2d * 1e6:>9.1f} "
              f"{nbytes / d2h / 1e9:>9.2f} {nbytes / h2d / 1e9:>9.2f} {staged / floor:>22.3f} {'yes' if good else 'NO':>3}")
    counted = [r["staged_over_floor"] for r in rows if r["bytes"] >= (1 << 20)]
    if counted:
        worst = max(counted)
        print(f"# target: staged/(host+d2h+h2d) <= 1.0 from 1 MiB: {'met' if worst <= 1.0 else 'missed'} "
              f"(worst {worst:.3f})")
    print("# OK" if ok else "# FAIL: a staged all_reduce gave a wrong result")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": args.device, "nproc": args.nproc, "rows": rows}, fh, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
