"""``torch.distributed.shrink_group`` on backend "ndist": a group made after a member told
this process it began the shrink of the default group is revoked from the start (issue 29;
the torch twin of tests/reliability/test_group_after_shrink_notice.py, continue kill trial
seed 100118).

3 ranks, the test hosts the store (``ndist://``). Rank 2 is SIGKILLed; rank 0 sees it go
(the torch job's member watch, ``ndist/torch/_watch.py``) and calls ``shrink_group([2])``,
which tells every process. Rank 1 makes ``new_group([0, 1])`` only after that notice came:
its first op raises ``DistRankFailureError`` naming rank 2 at once, where before it waited
the 10 s group timeout for rank 0's address while rank 0's shrink waited for rank 1."""

import signal
import textwrap

import pytest

pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]

_JOB = """
import os, signal, time
from datetime import timedelta
import torch
import torch.distributed as dist
import ndist.torch
from ndist.torch import _watch
from tests.kill_sync import all_past

torch.set_num_threads(1)
dist.init_process_group("ndist", init_method="ndist://", timeout=timedelta(seconds=10))
me = dist.get_rank()
store = dist.distributed_c10d._get_default_store()
dist.barrier()
all_past(store, me, dist.get_world_size(), victim=2)
if me == 2:
    os.kill(os.getpid(), signal.SIGKILL)
deadline = time.monotonic() + 30
while 2 not in _watch._job.lost:  # the member watch saw it go
    assert time.monotonic() < deadline, "rank 2's loss was never seen"
    time.sleep(0.01)
if me == 0:
    store.set("notice/shrinking", "1")
else:
    store.wait(["notice/shrinking"])
    time.sleep(1.0)  # rank 0's notice (on the member watch) came meanwhile
    g = dist.new_group([0, 1])
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4), group=g)
        print("sub no error", flush=True)
    except Exception as err:
        cause = type(err.__cause__).__name__ if err.__cause__ is not None else type(err).__name__
        print(f"sub {cause} {getattr(err, 'rank', None)}", flush=True)
        print(f"message {err}".replace(chr(10), " "), flush=True)
    print(f"took {time.monotonic() - t0:.2f}", flush=True)
dist.shrink_group([2])
y = torch.full((4,), float(me + 1))
dist.all_reduce(y)
print(f"result {dist.get_world_size()} {y[0].item():g}", flush=True)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.parametrize("transport,engine", [("tcp", "python"), ("auto", "native")])
def test_a_torch_group_made_after_a_members_shrink_notice_is_revoked_from_the_start(tmp_path, transport, engine):
    from tests.reliability.rank_loss_jobs import run_job

    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(_JOB))
    ended = run_job(str(script), 3, env={"NDIST_TRANSPORT": transport, "NDIST_ENGINE": engine}, timeout=90)
    assert ended[2].code == -signal.SIGKILL, [e.code for e in ended]
    one = ended[1].out + ended[1].err
    assert "sub DistRankFailureError 2" in ended[1].out, one[-4000:]
    message = next(ln for ln in ended[1].out.splitlines() if ln.startswith("message"))
    assert "rank 0" in message and "shrink_group" in message, message
    took = float(next(ln for ln in ended[1].out.splitlines() if ln.startswith("took")).split()[1])
    assert took < 3.0, one[-4000:]  # (the group timeout is 10 s)
    for rank in (0, 1):
        e = ended[rank]
        assert e.code == 0, (e.out + e.err)[-4000:]
        assert "result 2 3" in e.out, (e.out + e.err)[-4000:]  # 1 + 2
