"""A rank that ends before ``torch.distributed.init_process_group("ndist", init_method="ndist://")``
is named at once, as in ndist's own ``init_process_group`` (issue 44, part 1, through torch).

Under ``ndistrun`` the agent marks a rank that ended before it joined in the job's store
(ndist/runtime/_ended.py); torch's ``ndist://`` rendezvous reads those marks in its first join
of the attempt (ndist/torch/_rendezvous.py). 3 ranks; rank 1 waits until the two others wait in
torch's join, then exits 0 or is SIGKILLed. ``stop``: the others' init raises
``DistRankFailureError`` naming rank 1 (exit 0: then the launcher counts rank 1 as failed, it
was waited for) or the launcher tears the job down at once (SIGKILL); ``continue``: the others'
init raises, naming it. The time from the loss to the end is bounded generously (< 10 s: a
loaded 2-core machine); no rank and no /dev/shm file of the job is left."""

import glob
import json
import os
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

from ndist.runtime._shmfiles import job_prefix  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]

JOB = """
import json, os, signal, sys, time
from datetime import timedelta
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
d = os.path.dirname(os.path.abspath(__file__))

def put(name, value):
    with open(os.path.join(d, name + ".tmp"), "w") as f:
        f.write(json.dumps(value))
    os.replace(os.path.join(d, name + ".tmp"), os.path.join(d, name))

put(f"pid-{rank}", os.getpid())
put(f"secret-{rank}", os.environ["NDIST_SECRET"])
if rank == 1:  # the others' claims in torch's first ndist:// join of the attempt, then the end
    from ndist.runtime.store import TCPStore
    host, _, port = os.environ["NDIST_STORE"].rpartition(":")
    TCPStore(host, int(port), timeout=60).wait([f"ndist.torch/0/0/init/rank/{r}" for r in range(world) if r != rank])
    put("lost-at", time.time())
    if os.environ["HOW"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(0)
import torch
import torch.distributed as tdist
import ndist.torch
try:
    tdist.init_process_group("ndist", init_method="ndist://", timeout=timedelta(seconds=120))
except Exception as err:
    put(f"error-{rank}", {"at": time.time(), "type": type(err).__name__, "message": str(err),
                          "failed_ranks": getattr(err, "failed_ranks", None), "causes": getattr(err, "causes", None)})
    raise
put(f"joined-{rank}", True)
tdist.destroy_process_group()
"""

CAUSE = {"exit0": ("exited", "exit code 0"), "kill": ("died", "killed by SIGKILL")}


def _read(d, name):
    with open(os.path.join(d, name)) as f:
        return json.load(f)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


@pytest.mark.parametrize("mode,how", [("stop", "exit0"), ("stop", "kill"), ("continue", "kill")])
def test_torch_init_names_a_rank_lost_before_it_joined(tmp_path, mode, how):
    d = str(tmp_path)
    with open(os.path.join(d, "job.py"), "w") as f:
        f.write(JOB)
    env = {**os.environ, "HOW": how, "TMPDIR": d}
    cmd = [sys.executable, "-m", "ndist.launch", "--nproc-per-node", "3", "--on-failure", mode, "job.py"]
    p = subprocess.Popen(cmd, cwd=d, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        p.communicate()
        pytest.fail("the launcher did not end: the ranks waited for the lost rank in torch's init_process_group")
    ended = time.time()
    lost_at = _read(d, "lost-at")
    assert ended - lost_at < 10, ended - lost_at
    assert not [n for n in os.listdir(d) if n.startswith("joined-")]
    cause, said = CAUSE[how]
    errors = {r: _read(d, f"error-{r}") for r in (0, 2) if os.path.exists(os.path.join(d, f"error-{r}"))}
    if not (mode == "stop" and how == "kill"):  # (a kill under stop: the launcher may stop them before they raise)
        assert sorted(errors) == [0, 2], err
    for r, e in errors.items():
        assert (e["type"], e["failed_ranks"], e["causes"]) == ("DistRankFailureError", [1], [cause]), e
        assert (f"init_process_group on rank {r}: rank 1 ({socket.gethostname()}) {cause} before it joined the group "
                f"({said}, seen by the launcher)") in e["message"], e
        assert e["at"] - lost_at < 10, (r, e["at"] - lost_at)
    assert p.returncode != 0, err
    summary = err[err.index("=" * 72):]
    assert "root cause (first rank to fail):\n  rank       : 1 (local rank 1)" in summary, summary
    if how == "exit0":
        assert ("rank 1 (local rank 1) exited with exit code 0 before it joined the group (init_process_group), "
                "and other ranks waited for it there: it counts as failed") in err
    deadline = time.monotonic() + 5
    pids = [_read(d, f"pid-{r}") for r in range(3)]
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)
    assert glob.glob(f"/dev/shm/{job_prefix(_read(d, 'secret-0'))}*") == []
