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
@pytest.mark.parametrize("engine", [
    "python",
    pytest.param("native", marks=pytest.mark.xfail(
        strict=True, reason="socket backend, native engine: a collective on a group broken by an earlier failure "
        "raises RuntimeError('native group is broken by an earlier failure') from cnative.c's check_usable")),
])
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
