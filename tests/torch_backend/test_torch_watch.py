"""A torch job on backend "ndist" watches every member from ``init_process_group`` on
(``ndist/torch/_watch.py``), as ndist's own ``init_process_group`` does: a member gone before
any collective (a clean exit, or SIGKILL right after init) fails a survivor's first collective
within 1 s, naming it with how it went, instead of the group timeout. Run under torchrun
(its agent hosts the store). When rank 0 is SIGKILLed, a long ``--monitor-interval`` lets the
survivor finish before torchrun's agent looks (it tears the job down when a worker fails); the
test reads the survivor's lines as they come and ends the job once it has them, instead of
waiting out the interval. A clean exit is no failure to the agent, so that job checks every
second and ends as soon as the survivor does."""

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

pytest.importorskip("torch")

from tests.torch_backend.torch_helpers import clean_env, torchrun_tmp  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]

_JOB = """
import os, signal, sys, time
from datetime import timedelta
import torch
import torch.distributed as dist
import ndist.torch

how = sys.argv[1]
torch.set_num_threads(1)
dist.init_process_group("ndist", timeout=timedelta(seconds=30))
rank = dist.get_rank()
if rank == 0:
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(0)  # a clean exit before any collective, without destroy_process_group
time.sleep(0.5)  # rank 0 is gone by now
t0 = time.monotonic()
try:
    dist.all_reduce(torch.ones(4))
    print("no error", flush=True)
except Exception as err:
    cause = err.__cause__
    print(f"took {time.monotonic() - t0:.3f} type={type(err).__module__}.{type(err).__name__} "
          f"cause={type(cause).__name__} failed={getattr(err, 'failed_ranks', None)} "
          f"causes={getattr(err, 'causes', None)}", flush=True)
    print("message:", str(err).replace(chr(10), " "), flush=True)
t0 = time.monotonic()
try:  # the next one too, at once
    dist.all_reduce(torch.ones(4))
except Exception as err:
    print(f"again took {time.monotonic() - t0:.3f} failed={getattr(err, 'failed_ranks', None)}", flush=True)
"""


def _workers(agent: int) -> list[int]:
    """The agent's live child processes (its workers: torchrun starts each in a session of its
    own); the SIGKILLed rank is a zombie until the agent's next look, and does not count."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
        except OSError:  # (gone meanwhile)
            continue
        if int(ppid) == agent and state != "Z":
            found.append(int(entry))
    return found


@pytest.mark.parametrize("how,cause", [("exit", "exited"), ("kill", "died")])
def test_a_member_gone_before_the_first_collective_is_named_at_once_under_torchrun(tmp_path, how, cause):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(_JOB))
    env = clean_env(TMPDIR=torchrun_tmp(tmp_path))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))), env.get("PYTHONPATH")]))
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             "--monitor-interval", "20" if how == "kill" else "1", str(script), how], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    seen = threading.Event()  # the survivor's last line ("again took ...")

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("again took"):
                seen.set()
        seen.set()  # (the job ended without it: the asserts below say what came)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        seen.wait(150)
        if how == "exit":
            proc.wait(timeout=30)  # the agent sees a clean exit within its 1 s interval
        else:  # the agent would look only after its 20 s interval: end it once the survivor left
            deadline = time.monotonic() + 30
            while _workers(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join(10)
    text = "".join(lines)
    took = re.search(r"took (\S+) type=(\S+) cause=(\S+) failed=(\S+) causes=(\S+)", text)
    assert took is not None, text[-4000:]
    seconds, kind, why, failed, causes = took.groups()
    assert float(seconds) < 1.0, took.group(0)
    # what torch code sees: torch's DistNetworkError, ndist's DistRankFailureError its cause
    assert kind == "torch.distributed.DistNetworkError" and why == "DistRankFailureError", took.group(0)
    assert failed == "[0]" and causes == f"['{cause}']", took.group(0)
    message = re.search(r"message: (.*)", text).group(1)
    assert "rank 0 (" in message and cause in message, message
    again = re.search(r"again took (\S+) failed=(\S+)", text)
    assert again is not None and float(again.group(1)) < 0.1 and again.group(2) == "[0]", text[-4000:]
    if how == "exit":
        assert proc.returncode == 0, text[-4000:]
