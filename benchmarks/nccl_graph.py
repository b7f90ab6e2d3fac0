"""A CUDA graph of 100 small all_reduces through ndist's nccl backend vs the same 100 raw
``cupy.cuda.nccl`` calls captured into a graph, at world size 1 (issue 46's target).

Both graphs are captured on one stream (``Stream.begin_capture`` / ``end_capture``), then
launched ``--iters`` times; the time per launch is taken with CUDA events (median of
``--rounds`` rounds). ndist's graph holds what its backend enqueues for a float32 SUM
all_reduce (the NCCL call only), so the ratio ndist / raw should be close to 1.

Target: ndist / raw <= 1.2. Every replay's result is checked (PREMUL_SUM by 2 ten times
in each graph, so a graph that recorded nothing is caught).

Usage (on a GPU machine, from the repository root):

    python benchmarks/nccl_graph.py [--ops 100] [--bytes 4K] [--iters 50] [--json out.json]

Exit status 0 when the target is met and every result is right, 1 otherwise. Without CuPy,
a GPU or NCCL it prints one line starting with ``skipped:`` and exits 0 (tools/gpu_check.sh
counts that as a failure on a GPU machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import timedelta

from ndist.bench import parse_size

TARGET = 1.2


def _skip_reason() -> str | None:
    try:
        import cupy as cp
        from cupy.cuda import nccl
    except ImportError as err:
        return f"CuPy is not installed ({err})"
    try:
        if cp.cuda.runtime.getDeviceCount() == 0:
            return "no CUDA device"
    except Exception as err:  # noqa: BLE001 - cudaErrorNoDevice, no driver, ...
        return f"no usable CUDA device ({err})"
    if not getattr(nccl, "available", False):
        return "NCCL is not installed (cupy.cuda.nccl.available is False)"
    return None


def _capture(stream, fn):
    with stream:
        stream.begin_capture()
        try:
            fn()
        finally:
            graph = stream.end_capture()
    return graph


def _replay_s(cp, graph, stream, iters: int, rounds: int) -> float:
    """Median seconds per launch of ``graph`` on ``stream`` (CUDA events)."""
    times = []
    for _ in range(rounds):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        for _ in range(iters):
            graph.launch(stream=stream)
        stop.record(stream)
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3 / iters)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=100, help="all_reduces per graph")
    parser.add_argument("--bytes", default="4K", help="buffer size (K/M suffixes)")
    parser.add_argument("--iters", type=int, default=50, help="launches per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    reason = _skip_reason()
    if reason is not None:
        print(f"skipped: {reason}")
        return 0

    import cupy as cp
    from cupy.cuda import nccl

    from ndist.collectives import Call, Op, ReduceOp
    from ndist.runtime import BackendContext, HashStore, get_backend_spec

    ctx = BackendContext(store=HashStore(), rank=0, size=1, timeout=timedelta(minutes=5), group_name="graph-bench",
                         global_ranks=(0,), device="cuda")
    backend = get_backend_spec("nccl").create(ctx)
    raw = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    stream = cp.cuda.Stream(non_blocking=True)
    n = max(1, parse_size(args.bytes, name="--bytes") // 4)
    with stream:
        x = cp.ones(n, dtype=cp.float32)
        y = cp.ones(n, dtype=cp.float32)
    sum_call = Call(Op.ALL_REDUCE, "cuda", x.dtype, out=x, redop=ReduceOp.SUM)
    premul = Call(Op.ALL_REDUCE, "cuda", x.dtype, out=x, redop=ReduceOp.PREMUL_SUM, scale=2.0)
    doubling = min(10, args.ops)

    def ndist_body():
        for i in range(args.ops):
            backend.all_reduce(premul if i < doubling else sum_call, blocking=True)

    def raw_body():
        for i in range(args.ops):
            if i < doubling:
                cp.multiply(y, 2.0, out=y)
            raw.allReduce(y.data.ptr, y.data.ptr, y.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)

    with stream:  # once outside capture: NCCL connects, CuPy's pool has the blocks
        ndist_body()
        raw_body()
    stream.synchronize()
    g_nd = _capture(stream, ndist_body)
    g_raw = _capture(stream, raw_body)
    ok = True
    for graph, buf in ((g_nd, x), (g_raw, y)):
        with stream:
            buf.fill(1.0)
            graph.launch(stream=stream)
        stream.synchronize()
        ok &= bool((buf == float(2 ** doubling)).all())
    t_nd = _replay_s(cp, g_nd, stream, args.iters, args.rounds)
    t_raw = _replay_s(cp, g_raw, stream, args.iters, args.rounds)
    ratio = t_nd / t_raw
    met = ratio <= TARGET
    print(f"# CUDA graph of {args.ops} all_reduces of {n * 4} B (world size 1), NCCL {nccl.get_version()}")
    print(f"{'graph':>8} {'us per launch':>14} {'us per op':>10}")
    print(f"{'raw':>8} {t_raw * 1e6:>14.1f} {t_raw * 1e6 / args.ops:>10.2f}")
    print(f"{'ndist':>8} {t_nd * 1e6:>14.1f} {t_nd * 1e6 / args.ops:>10.2f}")
    print(f"# graph replay: ndist / raw = {ratio:.3f} (target <= {TARGET}); results {'right' if ok else 'WRONG'}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"ops": args.ops, "bytes": n * 4, "raw_s": t_raw, "ndist_s": t_nd, "ratio": ratio,
                       "target": TARGET, "results_right": ok}, fh, indent=2)
    backend.close()
    raw.destroy()
    if ok and met:
        print("# PASS")
        return 0
    print("# FAIL: " + ("a replay gave a wrong result" if not ok else f"ndist / raw = {ratio:.3f} > {TARGET}"))
    return 1


if __name__ == "__main__":
    sys.exit(main())
