"""Rank 0 hosts the store (env://); rank 1 dies (or hangs) after init; rank 0 then
calls destroy_process_group() and reports how long it took."""

import os
import sys
import time

import ndist.distributed as dist
from tests.runtime import _runtime_store_backend  # noqa: F401  test-only "storetest" backend

timeout, mode = float(sys.argv[1]), sys.argv[2]
dist.init_process_group("storetest", timeout=timeout)
pg = dist.resolve_group(None)
dist.barrier()
if dist.get_rank() == 1:
    pg.store.set("pid1", str(os.getpid()))
    if mode == "die":
        os._exit(3)
    time.sleep(600)
else:
    pid = int(pg.store.get("pid1"))
    if mode == "die":
        while True:  # until rank 1 is dead (gone or a zombie)
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().split()[2] == "Z":
                        break
            except (FileNotFoundError, ProcessLookupError):  # (reaped, even mid-read)
                break
            time.sleep(0.01)
    t0 = time.monotonic()
    dist.destroy_process_group()
    print(f"destroy took {time.monotonic() - t0:.3f}", flush=True)
