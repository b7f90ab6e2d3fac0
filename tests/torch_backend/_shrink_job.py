"""A torch job for tests/torch_backend/test_torch_shrink.py: 4 ranks on backend "ndist"
(``ndist://``: the test hosts the store), global rank 3 SIGKILLs itself; the survivors
print one line per check (``name value``)."""

import os
import signal
from datetime import timedelta

import torch
import torch.distributed as dist

import ndist.torch
from ndist.runtime import DistRankFailureError
from tests.kill_sync import all_past


def say(name, value):
    print(f"{name} {value}", flush=True)


torch.set_num_threads(1)
dist.init_process_group("ndist", init_method="ndist://", timeout=timedelta(seconds=60))
me = dist.get_rank()
say("backend", type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__)  # compiled or Python
sub = dist.new_group([1, 2, 3])  # rank 3 is rank 2 of sub
dist.barrier()
all_past(dist.distributed_c10d._get_default_store(), me, 4, victim=3)
if me == 3:
    os.kill(os.getpid(), signal.SIGKILL)

t = torch.ones(2)
try:
    dist.all_reduce(t)  # blocking: the lost member's error
except dist.DistNetworkError as err:
    say("first", f"{type(err).__name__} cause={type(err.__cause__).__name__} mentions3={'rank 3' in str(err)}")
try:
    dist.all_reduce(t)  # the group is revoked: the same error at once, with the ranks
except dist.DistNetworkError as err:
    say("revoked", f"{type(err).__name__} {isinstance(err.__cause__, DistRankFailureError)} {err.failed_ranks}")
say("failed", ndist.torch.get_failed_ranks())

# a rank that is alive cannot be excluded: every caller gets ValueError, nothing changes
try:
    dist.shrink_group([3] if me == 1 else [1, 3])
    say("alive", "shrunk")
except ValueError as err:
    say("alive", f"ValueError {dist.get_world_size()}")

if me in (1, 2):  # a group other than the default: ranks 1, 2 shrink sub without rank 3
    small = dist.shrink_group([2], group=sub)
    s = torch.tensor([float(me)])
    dist.all_reduce(s, group=small)
    say("sub", f"{small.rank()}/{small.size()} {dist.get_process_group_ranks(small)} sum={s.item():g}")

new = dist.shrink_group([3], shrink_flags=dist.distributed_c10d.SHRINK_ABORT)  # the default group: the new default
x = torch.tensor([float(me + 1)])
dist.all_reduce(x)
say("default", f"{new is dist.group.WORLD} {dist.get_rank()}/{dist.get_world_size()} sum={x.item():g} "
    f"backend={dist.get_backend()} {type(new._get_backend(torch.device('cpu'))).__name__}")
objs = [None] * dist.get_world_size()
dist.all_gather_object(objs, me)
say("objects", objs)
dist.destroy_process_group()
say("done", me)
