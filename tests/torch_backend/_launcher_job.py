"""A torch program for tests/torch_backend/test_launchers.py: joins through ``ndist://``
(or, with a second argument ``env``, torch's default ``env://``), runs a DDP step, an all_reduce and an object collective, prints one line."""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ndist.torch

backend = sys.argv[1]
# "env": torch's default rendezvous (env://, no init_method), as a torchrun script has it
init = {} if sys.argv[2:] == ["env"] else {"init_method": "ndist://"}
torch.set_num_threads(1)
if backend == "gloo":  # torch's own backend on the ndist:// store
    dist.init_process_group("gloo", **init)
else:
    dist.init_process_group("ndist", pg_options=ndist.torch.Options(backend=backend), **init)
rank, world = dist.get_rank(), dist.get_world_size()
model = DDP(torch.nn.Linear(4, 2))
model(torch.randn(3, 4)).sum().backward()
t = torch.ones(3) * (rank + 1)
dist.all_reduce(t)
objs = [None] * world
dist.all_gather_object(objs, rank)
print(f"rank {rank}/{world} backend {backend} sum {t[0].item():g} objs {objs}", flush=True)
dist.destroy_process_group()
if backend == "gloo":
    # torch 2.13's own Gloo group can abort the interpreter's exit ("terminate called without
    # an active exception", SIGABRT; pytorch/pytorch#190489): 5 of 20 runs of this job without
    # ndist under torchrun. The job is done; leave without the interpreter's teardown.
    os._exit(0)
