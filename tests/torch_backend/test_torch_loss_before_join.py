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

import os
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

from tests.reliability.before_join import JOB, nothing_left, read  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]

CAUSE = {"exit0": ("exited", "exit code 0"), "kill": ("died", "killed by SIGKILL")}


@pytest.mark.parametrize("mode,how", [("stop", "exit0"), ("stop", "kill"), ("continue", "kill")])
def test_torch_init_names_a_rank_lost_before_it_joined(tmp_path, mode, how):
    d = str(tmp_path)
    with open(os.path.join(d, "job.py"), "w") as f:
        f.write(JOB)
    env = {**os.environ, "API": "torch", "VICTIM": "1", "HOW": how, "TMPDIR": d}
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
    lost_at = read(d, "lost-at")
    assert ended - lost_at < 10, ended - lost_at
    assert not [n for n in os.listdir(d) if n.startswith("joined-")]
    cause, said = CAUSE[how]
    errors = {r: read(d, f"error-{r}") for r in (0, 2) if os.path.exists(os.path.join(d, f"error-{r}"))}
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
    nothing_left(d, range(3))
