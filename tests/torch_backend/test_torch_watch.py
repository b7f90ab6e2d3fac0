"""A torch job on backend "ndist" watches every member from ``init_process_group`` on
(``ndist/torch/_watch.py``), as ndist's own ``init_process_group`` does: a member gone before
any collective (a clean exit, or SIGKILL right after init) fails a survivor's first collective
within 1 s, naming it with how it went, instead of the group timeout. Run under torchrun
(its agent hosts the store). When rank 0 is SIGKILLed, a long ``--monitor-interval`` lets the
survivor finish before torchrun's agent looks (it tears the job down when a worker fails); a
clean exit is no failure to the agent, so that job checks every second and ends as soon as the
survivor does."""

import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

from torch_helpers import torchrun_tmp  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]

STRIP = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NDIST_STORE",
         "NDIST_SECRET")

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


@pytest.mark.parametrize("how,cause", [("exit", "exited"), ("kill", "died")])
def test_a_member_gone_before_the_first_collective_is_named_at_once_under_torchrun(tmp_path, how, cause):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(_JOB))
    env = {k: v for k, v in os.environ.items() if k not in STRIP}
    env["TMPDIR"] = torchrun_tmp(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))), env.get("PYTHONPATH")]))
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             "--monitor-interval", "20" if how == "kill" else "1", str(script), how], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = out + err
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
