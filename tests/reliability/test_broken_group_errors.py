"""Once a peer is lost, every later collective on that group raises the same kind of
error as the first: a ``DistError`` naming the lost rank, whatever the engine.

Found by benchmarks/kill_trials.py (seed 111, auto, native engine): with rank 2 of 4
killed while an async collective was in flight, survivors' next collective on the
group raised ``RuntimeError: native group is broken by an earlier failure``: not a
``DistError`` (``except dist.DistError`` misses it), and it names no rank."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

_JOB = """
import json, os, signal, sys
from datetime import timedelta
import numpy as np
import ndist.distributed as dist

out = sys.argv[1]
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # survivors stay to report; the launcher SIGKILLs after its grace
dist.init_process_group("socket", timeout=timedelta(seconds=20))
rank = dist.get_rank()
x = np.ones(64)
dist.all_reduce(x)
dist.barrier()
if rank == 2:
    os.kill(os.getpid(), signal.SIGKILL)
recs = []
work = dist.all_reduce(x, async_op=True)  # in flight when the peer dies; waited only later
for step in range(2):
    try:
        if step == 0:
            work.wait()
        else:
            dist.all_reduce(x)
        recs.append({"type": None})
    except Exception as err:
        recs.append({"type": type(err).__name__, "dist": isinstance(err, dist.DistError),
                     "peer": getattr(err, "rank", None), "msg": str(err)})
with open(os.path.join(out, f"r{rank}.json"), "w") as f:
    json.dump(recs, f)
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("engine", ["python", "native"])
def test_the_next_collective_on_a_broken_group_raises_a_dist_error_naming_the_lost_rank(tmp_path, engine):
    (tmp_path / "job.py").write_text(textwrap.dedent(_JOB))
    env = dict(os.environ, NDIST_TRANSPORT="auto", NDIST_ENGINE=engine)
    r = subprocess.run([sys.executable, "-m", "ndist.launch", "--nproc-per-node", "3", "--term-timeout", "30",
                        str(tmp_path / "job.py"), str(tmp_path)], capture_output=True, text=True, timeout=80, env=env)
    assert r.returncode != 0, r.stderr[-3000:]
    for rank in (0, 1):
        recs = json.loads((tmp_path / f"r{rank}.json").read_text())
        for rec in recs:  # the failed op, then the next one on the broken group
            assert rec["type"] == "DistNetworkError" and rec["dist"], (rank, recs)
            assert rec["peer"] == 2 and "rank 2" in rec["msg"], (rank, recs)


# Rank 0 learns from its receive that rank 2 is dead, tells rank 1 on the group's
# point-to-point streams (the p2p relay), and stops calling. Rank 1 then runs a
# broadcast from rank 0 on the same group: that group has lost a member, so the
# broadcast cannot complete, and rank 1's backend has been told so.
_P2P_THEN_COLLECTIVE_JOB = """
import json, os, signal, sys, time
from datetime import timedelta
import numpy as np
import ndist.distributed as dist

out = sys.argv[1]
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stay to report; the launcher SIGKILLs after its grace
dist.init_process_group("socket", timeout=timedelta(seconds=10))
rank, size = dist.get_rank(), dist.get_world_size()
x = np.ones(64)
dist.all_reduce(x)
dist.send(np.full(4, 1.0), dst=(rank + 1) % size)  # the point-to-point streams are up
dist.recv(np.zeros(4), src=(rank - 1) % size)
dist.barrier()
if rank == 2:
    with open(os.path.join(out, "killed"), "w") as f:
        f.write(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)
try:
    if rank == 0:
        dist.recv(np.zeros(4), src=2)
    else:
        time.sleep(1.0)  # rank 0's notice has arrived
        dist.broadcast(x, src=0)  # waits on rank 0 only
    rec = {"type": None}
except dist.DistError as err:
    rec = {"type": type(err).__name__, "peer": getattr(err, "rank", None), "msg": str(err)}
rec["t"] = time.time()
with open(os.path.join(out, f"r{rank}.json"), "w") as f:
    json.dump(rec, f)
deadline = time.time() + 15  # rank 0 stays (its exit would show rank 1 a lost connection to rank 0)
while rank == 0 and time.time() < deadline and not os.path.exists(os.path.join(out, "r1.json")):
    time.sleep(0.01)
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport,engine", [
    pytest.param("tcp", "python", marks=pytest.mark.xfail(
        strict=True, reason="socket backend: a group's collectives do not learn of a member's loss that its "
        "point-to-point side was told of (lost notice); rank 1 waits the group timeout")),
    # the native engine: rank 1's wait on rank 0 sees rank 2's process gone (every member's pid)
    ("auto", "native"),
])
def test_a_collective_fails_at_once_on_a_group_whose_p2p_side_heard_a_member_is_lost(tmp_path, transport, engine):
    (tmp_path / "job.py").write_text(textwrap.dedent(_P2P_THEN_COLLECTIVE_JOB))
    env = dict(os.environ, NDIST_TRANSPORT=transport, NDIST_ENGINE=engine)
    r = subprocess.run([sys.executable, "-m", "ndist.launch", "--nproc-per-node", "3", "--term-timeout", "30",
                        str(tmp_path / "job.py"), str(tmp_path)], capture_output=True, text=True, timeout=80, env=env)
    assert r.returncode != 0, r.stderr[-3000:]
    killed = float((tmp_path / "killed").read_text())
    rec0 = json.loads((tmp_path / "r0.json").read_text())
    assert rec0["type"] == "DistNetworkError" and rec0["peer"] == 2, rec0  # (passes today)
    rec1 = json.loads((tmp_path / "r1.json").read_text())
    assert rec1["type"] == "DistNetworkError" and rec1["peer"] == 2 and "rank 2" in rec1["msg"], rec1
    assert rec1["t"] - killed < 5, rec1  # 1 s + the 1 s sleep on a quiet machine; the group timeout is 10 s
