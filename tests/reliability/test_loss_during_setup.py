"""A member that dies while the survivors build a group's links (their first collective
waits in the store for the addresses it never publishes) fails them at once, naming it,
not at the group timeout. Found by examples/elastic_training.py with ``--kill-rank 0
--kill-step 0``: the survivors' first all_reduce waited in ``Mesh.wait_published``, which
looked only at members known dead by pid or by another group's record, not at the loss the
member watch had just told the group (``Mesh.abandon``)."""

import os
import textwrap
import time

import pytest

from tests.reliability.rank_loss_jobs import run_job  # noqa: E402

_JOB = """
import os, signal, time
from datetime import timedelta
import numpy as np
import ndist.distributed as dist

dist.init_process_group("socket", timeout=timedelta(seconds=20))
if dist.get_rank() == 0:
    time.sleep(1.0)  # the others are waiting for its address by now
    print(f"killed {time.time():.6f}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
try:
    dist.all_reduce(np.ones(4, dtype=np.float32))  # its first collective: the links are built now
    print("no error", flush=True)
except dist.DistError as err:
    print(f"raised {time.time():.6f} {type(err).__name__} failed={getattr(err, 'failed_ranks', None)}", flush=True)
    print("message:", err, flush=True)
time.sleep(2.0)  # (a survivor leaving early would be a loss too, for a slower one)
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("engine", ["native", "python"])
@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_member_that_dies_while_the_links_are_built_is_named_at_once(tmp_path, engine, transport):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(_JOB))
    t0 = time.monotonic()
    ends = run_job(str(script), 3, env={"NDIST_ENGINE": engine, "NDIST_TRANSPORT": transport})
    assert time.monotonic() - t0 < 15, "the survivors waited for the group timeout"
    killed = float(next(ln for ln in ends[0].out.splitlines() if ln.startswith("killed")).split()[1])
    for survivor in ends[1:]:
        assert survivor.code == 0, survivor.err[-3000:]
        line = next((ln for ln in survivor.out.splitlines() if ln.startswith("raised")), None)
        assert line is not None, survivor.out + survivor.err[-3000:]
        _, at, kind, failed = line.split(maxsplit=3)
        assert kind == "DistRankFailureError" and failed == "failed=[0]", line
        assert float(at) - killed < 1.0, line
