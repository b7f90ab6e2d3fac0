"""The job of the tests of a rank lost before it joins (tests/launch/test_loss_before_join.py,
through ndist's ``init_process_group``, and its torch twin
tests/torch_backend/test_torch_loss_before_join.py, through torch's on backend "ndist"): a
user's script under ndistrun, since what the launcher does with it is the test.

``JOB``: rank ``VICTIM`` waits until every other rank waits in ``init_process_group`` (its
claim is in the job's store: the join's keys, ndist/runtime/_ended.py), then ends as ``HOW``
says: "exit0" or "kill" (SIGKILL). The others call ``init_process_group`` (``API``: "ndist",
the default, or "torch") and record what it raised, and when. Every rank records its pid and
the job's secret: the test checks that nothing of the job is left."""

import glob
import json
import os

from ndist.runtime._shmfiles import job_prefix
from tests.launch.launch_helpers import wait_dead

JOB = """
import json, os, signal, sys, time
from datetime import timedelta
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
d = os.path.dirname(os.path.abspath(__file__))
torch = os.environ.get("API") == "torch"

def put(name, value):
    with open(os.path.join(d, name + ".tmp"), "w") as f:
        f.write(json.dumps(value))
    os.replace(os.path.join(d, name + ".tmp"), os.path.join(d, name))

put(f"pid-{rank}", os.getpid())
put(f"secret-{rank}", os.environ["NDIST_SECRET"])
if rank == int(os.environ["VICTIM"]):  # the others' claims in the first join of the attempt, then the end
    from ndist.runtime.store import TCPStore
    host, _, port = os.environ["NDIST_STORE"].rpartition(":")
    keys = "ndist.torch/0/0/init/rank/" if torch else "ndist/0/0/init/rank/"
    TCPStore(host, int(port), timeout=60).wait([f"{keys}{r}" for r in range(world) if r != rank])
    put("lost-at", time.time())
    if os.environ["HOW"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(0)
if torch:
    import torch.distributed as dist
    import ndist.torch
    join, error = lambda: dist.init_process_group("ndist", init_method="ndist://", timeout=timedelta(seconds=120)), Exception
else:
    import ndist.distributed as dist
    join, error = lambda: dist.init_process_group("socket", timeout=120), dist.DistError
try:
    join()
except error as err:
    put(f"error-{rank}", {"at": time.time(), "type": type(err).__name__, "message": str(err),
                          "failed_ranks": getattr(err, "failed_ranks", None), "causes": getattr(err, "causes", None)})
    raise
put(f"joined-{rank}", True)
dist.destroy_process_group()
"""


def read(d, name):
    """What the job's ranks recorded as ``name`` in folder ``d``."""
    with open(os.path.join(d, name)) as f:
        return json.load(f)


def nothing_left(d, ranks, secret=None) -> None:
    """No rank of ``ranks`` alive (those that recorded their pid) within 5 s, no /dev/shm file
    of the job (``secret``: the job's; by default the one a rank recorded)."""
    wait_dead([read(d, f"pid-{r}") for r in ranks if os.path.exists(os.path.join(d, f"pid-{r}"))], timeout=5)
    if secret is None:
        secret = next(read(d, f"secret-{r}") for r in ranks if os.path.exists(os.path.join(d, f"secret-{r}")))
    assert glob.glob(f"/dev/shm/{job_prefix(secret)}*") == []
