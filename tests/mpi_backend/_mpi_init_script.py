"""Run under ``mpiexec -n N``: init_process_group() with nothing but the MPI launcher's
environment (no MASTER_ADDR, no RANK), then a collective and a subgroup."""

import sys

import numpy as np

import ndist.distributed as dist
from tests.runtime import _runtime_store_backend  # noqa: F401  registers the test-only "storetest" backend

backend = None if sys.argv[1] == "default" else sys.argv[1]
dist.init_process_group(backend, timeout=60)
r, n = dist.get_rank(), dist.get_world_size()
x = np.array([float(r + 1)])
dist.all_reduce(x)
pair = dist.new_group([0, 1])
y = np.array([1.0])
if pair.is_member:
    dist.all_reduce(y, group=pair)
print(f"rank {r}/{n} backend {dist.get_backend()} sum {x[0]:g} pair {y[0]:g}", flush=True)
dist.destroy_process_group()
