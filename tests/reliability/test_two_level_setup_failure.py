"""A two-level group's set-up that fails linking a peer fails the same-host group naming
that peer, so a same-host rank already waiting in the set-up barrier names the cause.

Found by tools/trials/kill_trials.py across 2 hosts of 2 (``NDIST_NATIVE_HOSTS=2``, every call
in two levels, SIGSTOP trial seed 540): with rank 1 stopped, rank 2 timed out linking to it
in a new group's set-up and closed its same-host group; rank 3, in the set-up barrier there,
raised naming rank 2 ("closed the group"), a live survivor, not the stopped rank 1."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("ndist.collectives.backends.socket.native._cnative")

_JOB = """
import json, os, signal, sys, time
from datetime import timedelta
import numpy as np
import ndist.distributed as dist
from ndist.runtime import resolve_group

out = sys.argv[1]
dist.init_process_group("socket", timeout=timedelta(seconds=30))
rank = dist.get_rank()
# rank 2 alone gives up on a link after 3 s; rank 3 would wait 30 s in the set-up barrier
g = dist.new_group([1, 2, 3], timeout=timedelta(seconds=3 if rank == 2 else 30))
rec = {"type": None}
try:
    if rank == 3:
        dist.broadcast(np.zeros(4), 3, group=g)  # links ranks 1 and 2, then waits on rank 2 in the set-up
    elif rank == 1:
        resolve_group(g).backend_for("cpu")  # its side of g is up (addresses published, accepting)
        with open(os.path.join(out, "pid1"), "w") as f:
            f.write(str(os.getpid()))
        time.sleep(1.5)  # rank 3 has linked it
        os.kill(os.getpid(), signal.SIGSTOP)
    elif rank == 2:
        resolve_group(g).backend_for("cpu")  # (rank 3's set-up reads its address)
        time.sleep(3.0)
        dist.broadcast(np.zeros(4), 3, group=g)  # its link to the stopped rank 1 times out in the set-up
except dist.DistError as err:
    rec = {"type": type(err).__name__, "peer": getattr(err, "rank", None), "msg": str(err)}
with open(os.path.join(out, f"r{rank}.json"), "w") as f:
    json.dump(rec, f)
if rank == 0:  # the records are in: the stopped rank goes (the launcher then ends the job)
    deadline = time.time() + 40
    while time.time() < deadline and not all(os.path.exists(os.path.join(out, f"r{r}.json")) for r in (2, 3)):
        time.sleep(0.05)
    os.kill(int(open(os.path.join(out, "pid1")).read()), signal.SIGKILL)
os._exit(0)
"""


@pytest.mark.timeout(90)
def test_a_rank_waiting_in_the_set_up_names_the_peer_another_rank_could_not_link(tmp_path):
    (tmp_path / "job.py").write_text(textwrap.dedent(_JOB))
    env = dict(os.environ, NDIST_NATIVE_HOSTS="2", NDIST_NATIVE_TWO_LEVEL_MIN="0", NDIST_ENGINE="native")
    r = subprocess.run([sys.executable, "-m", "ndist.launch", "--nproc-per-node", "4", str(tmp_path / "job.py"),
                        str(tmp_path)], capture_output=True, text=True, timeout=80, env=env)
    for rank in (2, 3):
        assert (tmp_path / f"r{rank}.json").exists(), (rank, r.stderr[-4000:])
    rec2 = json.loads((tmp_path / "r2.json").read_text())
    assert rec2["type"] == "DistTimeoutError" and "ranks not heard from: [1]" in rec2["msg"], rec2
    rec3 = json.loads((tmp_path / "r3.json").read_text())
    assert rec3["type"] == "DistTimeoutError" and "ranks not heard from: [1]" in rec3["msg"], rec3
