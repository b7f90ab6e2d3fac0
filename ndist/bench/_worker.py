"""One benchmark rank: ``python -m ndist.bench._worker LIB RANK|env SIZE HOST:PORT|PATH``.

``env`` for the rank: the rank its launcher gave it (``PMI_RANK`` under mpiexec,
``RANK`` under ndistrun or torchrun). A ``PATH`` (with a ``/``) is a Unix socket.

The rank connects back to the launcher (``multiprocessing.connection`` with the
HMAC challenge on the key in ``NDIST_BENCH_AUTHKEY``), starts its library
through an adapter, then serves ``run`` requests until ``stop``. Waiting for the
next request is a blocking socket read, so an idle library's ranks use no CPU
while another library is being measured (MPI would busy-poll in a barrier).

For each request the rank times ``iters`` calls between barriers after
``warmup`` untimed ones and reports its own mean time per call; the launcher
takes the maximum over ranks (nccl-tests' time with ``-a 3``). Checking then
re-initialises the buffers, runs one call and counts wrong elements.
"""

from __future__ import annotations

import os
import resource
import socket
import sys
import time
import traceback
from multiprocessing.connection import Client

import numpy as np

from ._adapters import library_versions, make_adapter
from ._launch import AUTHKEY_ENV, BIND_CPU_ENV
from ._ops import count_wrong, layout, make_buffers, resolve_dtype


def run_case(adapter, rank: int, nranks: int, req: dict) -> dict:
    """Time and check one (op, size) on this rank; returns its share of the row."""
    op, dtype = req["op"], resolve_dtype(req["dtype"])
    redop, root = req["redop"], req["root"]
    lay = layout(op, req["nbytes"], dtype.itemsize, nranks)

    def fresh(with_expected):
        b = make_buffers(op, lay, dtype, rank, nranks, root, redop, with_expected)
        return b, adapter.wrap(b.send), adapter.wrap(b.recv)

    bufs, send, recv = fresh(False)
    for _ in range(req["warmup"]):
        adapter.run(op, send, recv, redop, root, nranks, rank)
    adapter.barrier()
    before = _placement()
    t0 = time.perf_counter()
    for _ in range(req["iters"]):
        adapter.run(op, send, recv, redop, root, nranks, rank)
    seconds = (time.perf_counter() - t0) / req["iters"]
    after = _placement()
    adapter.barrier()

    wrong = 0
    for _ in range(req["check"]):
        bufs, send, recv = fresh(True)
        adapter.barrier()
        adapter.run(op, send, recv, redop, root, nranks, rank)
        wrong += count_wrong(bufs.result, bufs.expected, nranks)
        if wrong:
            break
    return {"seconds": seconds, "wrong": wrong, "count": lay.count, "size": lay.size,
            # where the rank's calling thread ran: its CPU just before and just after the timed
            # calls, its affinity mask, and its context switches per timed call (voluntary, involuntary)
            "cpus": [before[0], after[0]], "mask": sorted(os.sched_getaffinity(0)),
            "switches": [(a - b) / req["iters"] for a, b in zip(after[1:], before[1:])]}


def _sched_getcpu():
    """``sched_getcpu()`` from the C library; None where it has none (then /proc is read)."""
    try:
        import ctypes

        return ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):
        return None


_getcpu = _sched_getcpu()


def _placement() -> tuple[int, int, int]:
    """``(cpu, voluntary, involuntary)``: the CPU this thread runs on and its context switches so far."""
    if _getcpu is not None:
        cpu = _getcpu()
    else:
        with open("/proc/thread-self/stat") as f:
            cpu = int(f.read().rsplit(")", 1)[1].split()[36])  # field 39, ``processor``
    ru = resource.getrusage(getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF))
    return cpu, ru.ru_nvcsw, ru.ru_nivcsw


def serve(lib: str, rank: int, nranks: int, address: tuple[str, int] | str, authkey: bytes) -> int:
    conn = Client(address, authkey=authkey)
    try:
        conn.send({"kind": "hello", "rank": rank, "pid": os.getpid(), "host": socket.gethostname(),
                   "cpus": sorted(os.sched_getaffinity(0))})

        def rendezvous(obj):
            # Rank 0 publishes, everyone (rank 0 too) gets rank 0's object back.
            conn.send({"kind": "publish", "rank": rank, "value": obj})
            return conn.recv()["value"]

        timeout = float(os.environ.get("NDIST_BENCH_TIMEOUT", "300"))
        adapter = make_adapter(lib, rank, nranks, rendezvous, timeout)
        # (one collective first: ndist's socket backend settles its engine at the group's first
        # collective, and before it ``get_engine`` cannot know yet that a peer is on another host)
        adapter.barrier()
        conn.send({"kind": "ready", "rank": rank, "versions": library_versions(lib)})
        while True:
            req = conn.recv()
            if req["kind"] == "stop":
                adapter.close()
                conn.send({"kind": "stopped", "rank": rank})
                return 0
            conn.send({"kind": "result", "rank": rank, **run_case(adapter, rank, nranks, req)})
    except (EOFError, ConnectionError, BrokenPipeError):
        return 3  # the launcher went away: nothing left to report to
    except BaseException:
        try:
            conn.send({"kind": "error", "rank": rank, "traceback": traceback.format_exc()})
        except OSError:
            pass
        return 1
    finally:
        conn.close()


def _bind() -> None:
    """Bind every thread of this rank to ``NDIST_BIND_CPUS`` (a comma-separated list) when it is
    set (``RankGroup(cpus=...)``, or ``ndistrun --bind-to core``, whose bootstrap did it already),
    before the library starts any."""
    cpus = os.environ.get(BIND_CPU_ENV)
    if cpus:
        mask = {int(c) for c in cpus.split(",")}
        for tid in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(tid), mask)


def _rank_from_env() -> int | None:
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 4:
        sys.stderr.write("usage: python -m ndist.bench._worker LIB RANK|env SIZE HOST:PORT|PATH\n")
        return 2
    lib, rank_s, size_s, addr = argv
    rank = _rank_from_env() if rank_s in ("env", "mpi") else int(rank_s)
    if rank is None:
        sys.stderr.write("ndist.bench._worker: rank 'env', but none of PMI_RANK, OMPI_COMM_WORLD_RANK, PMIX_RANK, "
                         "RANK is set\n")
        return 2
    if "/" in addr:
        address = addr  # a Unix socket
    else:
        host, _, port = addr.rpartition(":")
        address = (host, int(port))
    key = bytes.fromhex(os.environ.get(AUTHKEY_ENV, ""))
    if not key:
        sys.stderr.write(f"ndist.bench._worker: {AUTHKEY_ENV} is not set\n")
        return 2
    np.seterr(all="ignore")  # repeated in-place reductions overflow; only the check counts
    _bind()
    return serve(lib, rank, int(size_s), address, key)


if __name__ == "__main__":
    sys.exit(main())
