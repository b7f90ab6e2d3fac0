"""``torch.distributed.shrink_group`` on backend "ndist" when things go wrong around it
(issue 29); 4 ranks, the test hosts the store (``ndist://``), global rank 3 SIGKILLs itself.

* A rank lost while the survivors are inside the shrink: the survivors finish on the group
  without it (the agreement repeats, or a survivor that learns of it on the shrunk group
  shrinks that one), never hang. The torch twin of
  ``test_a_loss_during_the_shrink_makes_the_agreement_repeat`` (tests/reliability/
  test_rank_loss.py): rank 2 dies inside the agreement, once it posted what it saw (at its
  first pause), or as it adopts the decision.
* A survivor blocked in a healthy subgroup ([0, 1]) on a member that went into the shrink of
  the default group instead is released at once and shrinks too (the torch twin of
  tests/reliability/test_shrink_blocked_subgroup.py)."""

import signal
import sys
import textwrap

import pytest

pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]

_JOB = """
import os, signal, sys, time, types
from datetime import timedelta
import torch
import torch.distributed as dist
import ndist.torch
import ndist.runtime._shrink as shrink
from tests.kill_sync import all_past

when = sys.argv[1]
torch.set_num_threads(1)
dist.init_process_group("ndist", init_method="ndist://", timeout=timedelta(seconds=30))
me = dist.get_rank()
x = torch.ones(4)
dist.all_reduce(x)
all_past(dist.distributed_c10d._get_default_store(), me, 4, victim=3)
if me == 3:
    os.kill(os.getpid(), signal.SIGKILL)
try:
    while True:
        dist.all_reduce(x)
except dist.DistNetworkError:
    pass
if me == 2:  # lost inside the agreement
    def die(*a, **k):
        os.kill(os.getpid(), signal.SIGKILL)
    if when == "pause":
        shrink.time = types.SimpleNamespace(monotonic=shrink.time.monotonic, sleep=die)
    shrink._adopt = die
t0 = time.monotonic()
shrinks = 1
dist.shrink_group(ndist.torch.get_failed_ranks())  # (torch's takes a list: no None)
while True:  # a survivor that learns of rank 2's loss only on the shrunk group shrinks that one
    y = torch.full((4,), float(me + 1))
    try:
        dist.all_reduce(y)
        break
    except dist.DistNetworkError:
        dist.shrink_group(ndist.torch.get_failed_ranks())
        shrinks += 1
print(f"result {dist.get_world_size()} {dist.get_rank()} {y[0].item():g} {shrinks} {time.monotonic() - t0:.2f}",
      flush=True)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("when", ["pause", "adopt"])
def test_a_rank_lost_inside_torch_shrink_group_the_survivors_finish(tmp_path, when):
    from tests.reliability.rank_loss_jobs import run_job

    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(_JOB))
    ended = run_job(str(script), 4, [when], timeout=120)
    assert ended[3].code == -signal.SIGKILL and ended[2].code == -signal.SIGKILL, [e.code for e in ended]
    for rank in (0, 1):
        e = ended[rank]
        assert e.code == 0, (e.out + e.err)[-4000:]
        line = next((ln for ln in e.out.splitlines() if ln.startswith("result")), None)
        assert line is not None, (e.out + e.err)[-4000:]
        _, size, new_rank, total, _shrinks, seconds = line.split()
        assert (size, new_rank, total) == ("2", str(rank), "3"), line
        assert float(seconds) < 20.0, line  # (not the 30 s group timeout)


_BLOCKED = """
import os, signal, sys, time
from datetime import timedelta
import torch
import torch.distributed as dist
import ndist.torch
from ndist.runtime import DistRankFailureError
from tests.kill_sync import all_past

torch.set_num_threads(1)
dist.init_process_group("ndist", init_method="ndist://", timeout=timedelta(seconds=20))
me = dist.get_rank()
x = torch.ones(4)
dist.all_reduce(x)
sub = dist.new_group([0, 1])
dist.barrier()
all_past(dist.distributed_c10d._get_default_store(), me, 4, victim=3)
if me == 3:
    os.kill(os.getpid(), signal.SIGKILL)
if me == 1:  # waits in [0, 1]; rank 0 never joins
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4), group=sub)
        print("sub no error", flush=True)
    except dist.DistNetworkError as err:
        print(f"sub {type(err.__cause__).__name__} {err.failed_ranks} {err.rank} {time.monotonic() - t0:.2f}",
              flush=True)
else:
    try:
        while True:
            dist.all_reduce(x)
    except dist.DistNetworkError:
        pass
    if me == 0:
        time.sleep(0.5)  # rank 1 is blocked in the subgroup by now
dist.shrink_group(ndist.torch.get_failed_ranks())
y = torch.full((4,), float(me + 1))
dist.all_reduce(y)
print(f"result {dist.get_world_size()} {dist.get_rank()} {y[0].item():g}", flush=True)
dist.destroy_process_group()
"""


def test_a_survivor_blocked_in_a_healthy_subgroup_is_released_by_torchs_shrink(tmp_path):
    from tests.reliability.rank_loss_jobs import run_job

    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(_BLOCKED))
    ended = run_job(str(script), 4, timeout=120)
    assert ended[3].code == -signal.SIGKILL, [e.code for e in ended]
    for rank in (0, 1, 2):
        e = ended[rank]
        assert e.code == 0, (e.out + e.err)[-4000:]
        assert f"result 3 {rank} 6" in e.out, (e.out + e.err)[-4000:]
    line = next(ln for ln in ended[1].out.splitlines() if ln.startswith("sub"))
    _, cause, failed, named, seconds = line.split()
    assert (cause, failed, named) == ("DistRankFailureError", "[]", "3"), line
    assert float(seconds) < 3.0, line  # (rank 0 goes to the shrink 0.5 s after the loss)
