"""Started as if by ``srun``: only SLURM_* variables (+ MASTER_PORT) say who this rank is."""

import numpy as np

import ndist.distributed as dist
from tests.runtime import _runtime_store_backend  # noqa: F401  test-only "storetest" backend

dist.init_process_group("storetest", timeout=60)
x = np.array([1.0])
dist.all_reduce(x)
from ndist.runtime import _env  # noqa: E402

# ranks per node from SLURM_STEP_TASKS_PER_NODE (new_subgroups() itself defaults, as torch,
# to the CUDA device count)
cur, _ = dist.new_subgroups(_env.detect().local_world_size)
print(f"rank {dist.get_rank()}/{dist.get_world_size()} sum {x[0]:g} sub {list(cur.ranks)}", flush=True)
dist.destroy_process_group()
