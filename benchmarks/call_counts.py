"""Instructions per repeated collective call, counted with callgrind (not timed).

    python benchmarks/call_counts.py                       # every config and op, a table
    python benchmarks/call_counts.py --configs socket2 --ops all_reduce --loop 500

A count of instructions does not depend on the machine's load, so it can be taken on
a shared machine where wall-clock times cannot. Each count is
(I(2N) - I(N)) / N: the same program run under callgrind with N and with 2N calls
of one op, so start-up, set-up and teardown cancel. Only the calls themselves are
collected: every program makes its N calls as ``deque(map(lambda _: fn(), repeat(None, N)),
0)``; the ~800 instructions of that loop and lambda are in every figure, raw mpi4py's too.
The workers below (``--worker``) mark that loop for callgrind themselves (``MARKS``, compiled
here with the system C compiler against valgrind's ``callgrind.h``): callgrind runs with
``--instr-atstart=no --collect-atstart=no`` and the worker starts the instrumentation and
turns collection on just before the loop and off just after it, in its main thread. The
other programs (``api``, ``mpi``, ``mpi-memoryview``, ``raw``) run with ``--collect-atstart=no
--toggle-collect=map_next``: every ``map`` step collected, which is their loop only. (The
workers did that too until 2026-11-29. ``import torch`` calls ``map`` itself, over tuples,
lists and generators, while it registers its operators, so ``socket2-torch`` collected ~148 M
instructions of torch's import in each run beside its calls; (I(2N) - I(N)) / N cancelled
most of it but not its run-to-run variation, thousands of instructions per call at N = 200.)
Only the main thread's file (``-01`` of ``--separate-threads=yes``) is read. 4 KiB float32
buffers.

Configs (``--configs``):

* ``api``: the public layer alone, world size 1, over a backend whose methods
  return at once (``api_overhead.py --loop``);
* ``mpi`` / ``raw``: ndist's mpi backend / mpi4py directly, world size 1 without
  ``mpiexec`` (``mpi_overhead.py --loop``): at one rank nothing is communicated;
* ``mpi-memoryview``: ``mpi`` with a ``memoryview`` of each of the same buffers
  (``mpi_overhead.py --wrap memoryview``): the Python lane (``_plain.PlainLane``), which the
  Python engine runs too, on a buffer-protocol object;
* ``socket2-torch``: ``socket2`` with torch CPU tensors (``torch.from_numpy`` of the same
  buffers) passed to ndist's own API instead of NumPy arrays;
* ``socket2-memoryview``: ``socket2`` with a ``memoryview`` of each of the same buffers (an
  object that only exports the buffer protocol);
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
* ``capi2``: the same group, each call through the engine's C interface
  (``ndist_engine.h``) as the compiled torch backend makes it: a small C loop (built
  here with the system C compiler) calls the table's function N times without the
  GIL, from one ``map`` step, so no Python runs per call but the C interface's own.
  Every op (``all_to_all_single_uneven``: the table's ``all_to_all_v``).
* ``socket4two``: the native engine's two levels (``ctwo.c``): n = 4 as 2 simulated hosts of 2
  (``NDIST_NATIVE_HOSTS=2``), every call in two levels (``NDIST_NATIVE_TWO_LEVEL_MIN=0``):
  shared memory inside each host, TCP between the hosts' leaders. Rank 0 (a leader) runs
  under callgrind and starts ranks 1 to 3; ``wait_ge`` is taken out as for ``socket2``. The
  TCP engine's wait is not a function of its own (``xchg``'s loop): rank 0, slowed by
  callgrind, is the last to come to every step, so its peers' data is there when it reads.
* ``torch2``: ``torch.distributed`` on backend ``"ndist"`` with the compiled backend
  (``NDIST_TORCH_COMPILED=1``, built or taken from ``$TORCH_EXTENSIONS_DIR``), the same
  n = 2 and buffers as torch tensors: ``all_reduce``, ``broadcast``, ``all_to_all_single``.
  Slow under callgrind (torch's import alone takes minutes).

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
CONFIGS = ("socket2", "socket2-torch", "socket2-memoryview", "capi2", "socket4two", "torch2", "api", "mpi",
           "mpi-memoryview", "raw")
WORKERS = ("socket2", "socket2-torch", "socket2-memoryview", "capi2", "socket4two", "torch2")
#: each worker config's world size (2 unless named)
SIZES = {"socket4two": 4}
#: the environment of a config's ranks beside the caller's
ENVS = {"socket4two": {"NDIST_NATIVE_HOSTS": "2", "NDIST_NATIVE_TWO_LEVEL_MIN": "0"}}
TORCH_OPS = ("all_reduce", "broadcast", "all_to_all_single")
WAIT_FN = "wait_ge"
# the workers' marks around their loop (``on()`` ... ``off()``), callgrind's client requests: nothing
# runs outside valgrind
MARKS = r"""
#include <valgrind/callgrind.h>
void cc_on(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_TOGGLE_COLLECT; }
void cc_off(void) { CALLGRIND_TOGGLE_COLLECT; }
"""
# the C interface's loop (capi2): ``n`` calls of op ``op`` (CAPI_OPS), err NULL
CAPI_OPS = {"all_reduce": 0, "broadcast": 1, "all_to_all_single": 2, "all_gather_into_tensor": 3,
            "reduce_scatter_tensor": 4, "all_to_all_single_uneven": 5}
CAPI_LOOP = r"""
#include <stdint.h>
#include "ndist_engine.h"
int cc_loop(const ndist_engine_api *api, ndist_group g, int op, void *out, const void *in, size_t count, int n,
            const int64_t *oc, const int64_t *ic, size_t in_count)
{
    for (int i = 0; i < n; i++) {
        int st = op == 0   ? api->all_reduce(g, out, count, NDIST_FLOAT32, NDIST_SUM, NULL)
                 : op == 1 ? api->broadcast(g, out, count, NDIST_FLOAT32, 0, NULL)
                 : op == 2 ? api->all_to_all(g, out, in, count, NDIST_FLOAT32, NULL)
                 : op == 3 ? api->all_gather(g, out, in, count, NDIST_FLOAT32, NULL)
                 : op == 4 ? api->reduce_scatter(g, out, in, count, NDIST_FLOAT32, NDIST_SUM, NULL)
                           : api->all_to_all_v(g, out, count, oc, in, in_count, ic, NDIST_FLOAT32, NULL);
        if (st)
            return st;
    }
    return 0;
}
"""


# ----------------------------------------------------------------- workers
def _socket_worker(args) -> None:
    """One rank of the socket backend at n = 2 (``socket4two``: 4; rank 0 starts the others)."""
    peers = []
    path = args.init
    size = SIZES.get(args.worker, 2)
    if args.rank == 0:
        path = tempfile.mktemp(prefix="ndist-call-counts-")
        env = dict(os.environ, **ENVS.get(args.worker, {}))
        env.setdefault("NDIST_SECRET", secrets.token_hex(16))
        os.environ.setdefault("NDIST_SECRET", env["NDIST_SECRET"])  # (a benchmark script, not the library)
        peers = [subprocess.Popen([sys.executable, __file__, "--worker", args.worker, "--rank", str(r), "--init", path,
                                   "--op", args.op, "--loop", str(args.loop), "--bytes", str(args.bytes)], env=env)
                 for r in range(1, size)]
    if args.worker == "torch2":
        _torch_worker(args, path, peers[0] if peers else None)
        return
    import ndist.distributed as dist

    dist.init_process_group("socket", init_method=f"file://{path}", rank=args.rank, world_size=size)
    try:
        # benchmarks/mpi_overhead.py, beside this script (sys.path[0]): the same buffers and closures
        from mpi_overhead import ndist_calls

        if args.worker == "capi2":
            loop = _capi_loop(dist, args.rank, 2, args.bytes, args.op)
            loop(20)
            on, off = _marks(args.marks)
            on()
            deque(map(lambda _: loop(args.loop), repeat(None, 1)), 0)
            off()
        else:
            wrap = None
            if args.worker == "socket2-torch":
                import torch

                wrap = torch.from_numpy
            elif args.worker == "socket2-memoryview":
                wrap = memoryview
            fn = ndist_calls(dist, args.rank, size, args.bytes, wrap)[args.op]
            for _ in range(20):
                fn()
            on, off = _marks(args.marks)
            on()
            deque(map(lambda _: fn(), repeat(None, args.loop)), 0)
            off()
        dist.barrier()
    finally:
        dist.destroy_process_group()
        for peer in peers:
            peer.wait(timeout=120)
        if peers:
            try:
                os.unlink(path)
            except OSError:
                pass


def _torch_worker(args, path: str, peer) -> None:
    """One rank of torch.distributed on backend "ndist", compiled (NDIST_TORCH_COMPILED=1)."""
    import torch
    import torch.distributed as tdist

    import ndist.torch  # noqa: F401  (registers the backend "ndist")

    tdist.init_process_group("ndist", init_method=f"file://{path}", rank=args.rank, world_size=2)
    try:
        n = args.bytes // 4 // 2 * 2
        full, out = torch.ones(n), torch.empty(n)
        fn = {"all_reduce": lambda: tdist.all_reduce(full), "broadcast": lambda: tdist.broadcast(full, 0),
              "all_to_all_single": lambda: tdist.all_to_all_single(out, full)}[args.op]
        for _ in range(20):
            fn()
        on, off = _marks(args.marks)
        on()
        deque(map(lambda _: fn(), repeat(None, args.loop)), 0)
        off()
        from ndist.torch import ops

        calls = ops.engine_calls()
        if calls < args.loop:  # (the Python backend, or ops that left the engine: not what is counted)
            raise RuntimeError(f"torch2: expected {args.loop} calls on the compiled backend's engine, got {calls}")
        tdist.barrier()
    finally:
        tdist.destroy_process_group()
        if peer is not None:
            peer.wait(timeout=600)
            try:
                os.unlink(path)
            except OSError:
                pass


def _capi_loop(dist, rank: int, size: int, nbytes: int, op: str):
    """``loop(n)``: ``n`` calls of ``op`` through the engine's C interface, from C (CAPI_LOOP,
    compiled here), on ``mpi_overhead._buffers``' arrays; the GIL is released around it."""
    import ctypes
    import shutil

    import ndist.collectives as col
    from ndist.collectives.backends.socket.native import _cnative
    from mpi_overhead import _buffers

    import numpy as np

    b = _buffers(rank, size, nbytes)
    out, inp = {"all_reduce": (b["full"], None), "broadcast": (b["full"], None),
                "all_to_all_single": (b["out"], b["full"]), "all_gather_into_tensor": (b["out"], b["part"]),
                "reduce_scatter_tensor": (b["part_out"], b["full"]),
                "all_to_all_single_uneven": (b["uout"], b["uin"])}[op]
    count = (inp if op == "all_gather_into_tensor" else out).size
    oc, ic = np.array(b["outs"], np.int64), np.array(b["ins"], np.int64)  # (all_to_all_v's split sizes)
    folder = tempfile.mkdtemp(prefix="ndist-cc-capi-")
    try:
        src, lib = os.path.join(folder, "loop.c"), os.path.join(folder, "loop.so")
        Path(src).write_text(CAPI_LOOP)
        cc = os.environ.get("CC") or shutil.which("cc") or "gcc"
        subprocess.run([cc, "-O2", "-shared", "-fPIC", f"-I{col.engine_include_dir()}", src, "-o", lib], check=True)
        fn = ctypes.CDLL(lib).cc_loop
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    api = get(_cnative._C_API, b"ndist.collectives.backends.socket.native._cnative._C_API")
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                   ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    dist.barrier()  # the group's set-up, before its handle
    h, code = col.engine_handle(), CAPI_OPS[op]
    po, pi = out.ctypes.data, None if inp is None else inp.ctypes.data
    poc, pic, in_count = oc.ctypes.data, ic.ctypes.data, 0 if inp is None else inp.size

    def loop(n: int, _keep=(out, inp, oc, ic)) -> None:  # (the arrays live as long as the loop)
        st = fn(api, h, code, po, pi, count, n, poc, pic, in_count)
        if st:
            raise RuntimeError(f"{op} through the C interface: status {st}")

    return loop


def _marks(path: str):
    """``(on, off)``: MARKS' functions from the library ``path``; no-ops without one (ranks not
    under callgrind)"""
    if not path:
        return (lambda: None), (lambda: None)
    import ctypes

    lib = ctypes.CDLL(path)
    return lib.cc_on, lib.cc_off


def _build_marks(folder: str) -> str:
    """MARKS compiled into ``folder``: the library's path"""
    import shutil

    src, lib = os.path.join(folder, "marks.c"), os.path.join(folder, "marks.so")
    Path(src).write_text(MARKS)
    cc = os.environ.get("CC") or shutil.which("cc") or "gcc"
    res = subprocess.run([cc, "-O2", "-shared", "-fPIC", src, "-o", lib], capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"{cc} could not build the callgrind marks (valgrind/callgrind.h):\n{res.stderr}")
    return lib


# ----------------------------------------------------------------- driver
def _command(config: str, op: str, loop: int, nbytes: int, marks: str = "") -> list[str]:
    py = sys.executable
    if config == "api":
        return [py, str(HERE / "api_overhead.py"), "--loop", str(loop), "--backend", "api", "--op", op,
                "--bytes", str(nbytes)]
    if config in ("mpi", "mpi-memoryview", "raw"):
        return [py, str(HERE / "mpi_overhead.py"), "--loop", str(loop), "--op", op, "--bytes", str(nbytes),
                "--side", "raw" if config == "raw" else "ndist",
                *(["--wrap", "memoryview"] if config == "mpi-memoryview" else [])]
    return [py, __file__, "--worker", config, "--rank", "0", "--op", op, "--loop", str(loop),
            "--bytes", str(nbytes), "--marks", marks]


def _count(config: str, op: str, loop: int, nbytes: int, folder: str, keep: str | None = None,
           marks: str = "") -> int:
    """Instructions collected in the main thread, less ``wait_ge`` for the socket workers (their
    loop marked by ``marks``, MARKS' library); ``keep``: a folder the run's callgrind files are
    moved to (every thread's), for ``callgrind_annotate``."""
    out = os.path.join(folder, f"cg-{config}-{op}-{loop}")
    window = ["--instr-atstart=no"] if config in WORKERS else ["--toggle-collect=map_next"]
    cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--collect-atstart=no", *window,
           f"--callgrind-out-file={out}.%p", *_command(config, op, loop, nbytes, marks)]
    env = dict(os.environ, PYTHONHASHSEED="0", **ENVS.get(config, {}))
    if config == "torch2":
        env["NDIST_TORCH_COMPILED"] = "1"  # (a build that fails raises: no Python backend counted instead)
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if res.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    files = sorted(p for p in Path(folder).glob(Path(out).name + ".*-01"))
    if len(files) != 1:
        raise RuntimeError(f"expected one main-thread file for {out}, found {files}")
    text = files[0].read_text(errors="replace")
    m = re.search(r"^totals:\s+(\d+)", text, re.M) or re.search(r"^summary:\s+(\d+)", text, re.M)
    total = int(m.group(1))
    if config in WORKERS:
        total -= _inclusive(files[0], WAIT_FN)
    for f in Path(folder).glob(Path(out).name + ".*"):
        if keep:
            os.replace(f, os.path.join(keep, f.name))
        else:
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
    parser.add_argument("--keep", metavar="DIR", help="move every run's callgrind files (one per thread, "
                        "cg-CONFIG-OP-N.PID-TID) into DIR, an existing folder, to compare them per function")
    parser.add_argument("--worker", choices=WORKERS, help="(internal) run one loop, no callgrind")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--init", default="")
    parser.add_argument("--marks", default="", help="(internal) MARKS' library: rank 0's loop is marked")
    parser.add_argument("--op", default="all_reduce", choices=OPS)
    args = parser.parse_args()
    if args.worker:
        _socket_worker(args)
        return
    configs, ops = args.configs.split(","), args.ops.split(",")
    bad = [c for c in configs if c not in CONFIGS] + [o for o in ops if o not in OPS]
    bad += [f"capi2 with {o}" for o in ops if "capi2" in configs and o not in CAPI_OPS]
    bad += [f"torch2 with {o}" for o in ops if "torch2" in configs and o not in TORCH_OPS]
    if bad:  # before any worker starts under callgrind
        parser.error(f"--configs, --ops: expected names of {', '.join(CONFIGS)} and {', '.join(OPS)}; got {bad}")
    if args.keep and not os.path.isdir(args.keep):
        parser.error(f"--keep: expected an existing folder, got {args.keep!r}")
    print(f"# instructions per call, (I(2N) - I(N)) / N, N = {args.loop}, {args.bytes} B float32; socket2*, "
          f"capi2, socket4two and torch2 without {WAIT_FN}")
    widths = [max(10, len(c) + 1) for c in configs]
    print(f"{'op':<26}" + "".join(f"{c:>{w}}" for c, w in zip(configs, widths)))
    with tempfile.TemporaryDirectory(prefix="ndist-cg-") as folder:
        marks = _build_marks(folder) if any(c in WORKERS for c in configs) else ""
        for op in ops:
            row = []
            for config in configs:
                a = _count(config, op, args.loop, args.bytes, folder, args.keep, marks)
                b = _count(config, op, 2 * args.loop, args.bytes, folder, args.keep, marks)
                row.append((b - a) / args.loop)
            print(f"{op:<26}" + "".join(f"{v:>{w},.0f}" for v, w in zip(row, widths)), flush=True)


if __name__ == "__main__":
    main()
