"""A small job for ThreadSanitizer (docs/native.md, "Thread safety"): on rank 0, two C threads
of ``capi_test.c`` (built here with the system C compiler) make table calls on the world group
without the GIL (the C core: claim, number, record, op) while the main thread, holding the GIL,
reads what they write: the flight recorder's ring (``dist.flight_recorder()``: the ring's
seqlock readers) and the running op's description (``NativeAlgorithms.desc``: each FastLane's
``current()``). The two threads also contend for the group's lane (one claims it, the other's
call goes through the Python hooks). The other ranks make the matching calls through
``ndist.distributed``. Run by ``tools/tsan/check.py`` (or by hand, under a TSan build):
``ndistrun --nproc-per-node 2 --no-python python tests/collectives/backends/capi_threads_job.py [calls]``
with the repository on ``PYTHONPATH``."""

import pathlib
import sys
import tempfile
import time

import numpy as np

import ndist.collectives as col
import ndist.distributed as dist
from tests.collectives.backends import _capi_ctypes as C

#: calls per C thread after its first (the first argument, if given)
CALLS = int(sys.argv[1]) if len(sys.argv) > 1 else 300
COUNT = 512


def main() -> None:
    dist.init_process_group("socket")
    r, n = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    h = col.engine_handle()
    if r != 0:
        for _ in range(2 * (CALLS + 1)):
            y = np.ones(COUNT)
            dist.all_reduce(y)
            assert (y == n).all(), y
        dist.barrier()
        dist.destroy_process_group()
        return
    nat = dist.group.WORLD.backend_for("cpu")._native
    with tempfile.TemporaryDirectory() as tmp:
        lib = C.build_library(pathlib.Path(tmp))
        threads = [C.Calls(str(lib), h, CALLS + 1, COUNT) for _ in range(2)]
        deadline = time.monotonic() + 60
        while any(c.done() < 1 for c in threads) and time.monotonic() < deadline:  # (their first calls take the GIL)
            time.sleep(0.001)
        for c in threads:
            c.go()
        reads = 0
        while sum(c.done() for c in threads) < 2 * (CALLS + 1) and time.monotonic() < deadline:
            entries = dist.flight_recorder()  # (the ring's readers, while the threads write it)
            assert all(e["op"] in ("all_reduce", "barrier") for e in entries), entries
            assert "all_reduce" in nat.desc() or "no collective" in nat.desc()
            reads += 1
        results = [c.join() for c in threads]
    assert all(rc == 0 for rc, _ in results), results
    dist.barrier()
    seqs = [e["seq"] for e in dist.flight_recorder()]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
    print(f"rank 0: {2 * (CALLS + 1)} calls from 2 C threads, {reads} reads of the recorder meanwhile", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
