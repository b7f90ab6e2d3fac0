"""A rank that dies during point-to-point traffic fails every survivor at once,
naming it, including survivors that only wait on live ranks: the rank that
sees the death tells its peers (as collectives do), and they tell theirs."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

_RING_JOB = """
import json, os, signal, sys, time
from datetime import timedelta
import numpy as np
import ndist.distributed as dist

out = sys.argv[1]
signal.signal(signal.SIGTERM, lambda *a: None)  # stay alive to report; the launcher SIGKILLs after the grace
dist.init_process_group("socket", timeout=timedelta(seconds=30))
rank, size = dist.get_rank(), dist.get_world_size()
x = np.full(256, float(rank))
y = np.empty_like(x)
for i in range(100000):
    if rank == 0 and i == 20:
        with open(os.path.join(out, "killed"), "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        dist.send(x, dst=(rank + 1) % size)
        dist.recv(y, src=(rank - 1) % size)
    except dist.DistError as err:
        with open(os.path.join(out, f"r{rank}.json"), "w") as f:
            json.dump({"t": time.time(), "type": type(err).__name__, "peer": getattr(err, "rank", None),
                       "host": getattr(err, "host", None), "msg": str(err)}, f)
        # stay until every survivor has reported (an exiting rank is no news about rank 0)
        deadline = time.time() + 40
        while time.time() < deadline and len([n for n in os.listdir(out) if n.startswith("r")]) < size - 1:
            time.sleep(0.01)
        sys.exit(3)
"""


@pytest.mark.timeout(150)
@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_a_ring_of_send_recv_fails_every_survivor_at_once_naming_the_dead_rank(tmp_path, transport):
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(_RING_JOB))
    env = dict(os.environ, NDIST_TRANSPORT=transport)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "ndist.launch", "--nproc-per-node", "4", "--term-timeout", "45",
                        str(job), str(tmp_path)], capture_output=True, text=True, timeout=130, env=env)
    assert r.returncode != 0, r.stderr[-3000:]
    killed = float((tmp_path / "killed").read_text())
    for rank in (1, 2, 3):
        rec = json.loads((tmp_path / f"r{rank}.json").read_text())
        # rank 1 receives from the dead rank; rank 2 only from rank 1 and rank 3 only
        # from rank 2, both alive: they hear of it from their peers, not at the 30 s timeout
        assert rec["type"] in ("DistRankFailureError", "DistNetworkError"), (rank, rec)
        assert rec["peer"] == 0 and rec["host"], (rank, rec)
        assert "rank 0" in rec["msg"], (rank, rec)
        assert rec["t"] - killed < 3, (rank, rec)  # 1 s when the machine is quiet
    assert time.monotonic() - t0 < 120
