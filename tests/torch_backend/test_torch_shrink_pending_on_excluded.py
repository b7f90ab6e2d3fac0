"""``torch.distributed.shrink_group`` on backend "ndist": a survivor whose default group does
not know yet that a member is lost, with point-to-point operations of that group still
pending on it, finishes the shrink excluding it without waiting for them (issue 29; the torch
twin of tests/reliability/test_shrink_pending_on_excluded.py).

4 ranks, the test hosts the store (``ndist://``). Rank 2's member watch (``ndist/torch/
_watch.py``) is held back: its ``on_loss`` waits until rank 2 calls ``shrink_group``, then
3 s more (as a watch late under load is). Rank 2 posts a ``dist.isend`` and a ``dist.irecv``
with rank 3 on the world, which has no link to rank 3 (rank 3 never publishes its address
there). Rank 3 is SIGKILLed; once the watches of ranks 0 and 1 saw it go, all three call
``shrink_group([3])`` and agree to exclude it. Without the excluded member recorded as lost
in the old group, rank 2's shrink ends by destroying the old group (torch's
``_finalize_shrunk_group``) with both operations pending: the graceful close waits for the
queued send to rank 3 for the whole group timeout (the loss the watch tells once released
no longer reaches a group being closed), and ranks 0 and 1 time out in the shrunk group's
set-up waiting for rank 2. Now the torch shrink records the members it excludes as lost in
the group it shrinks first: what is pending on them fails at once, naming them."""

import signal
import sys
import textwrap

import pytest

pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]

_TIMEOUT_S = 10.0  # the group timeout: a close that waits on the pending send waits this long
_HOLD_S = 3.0  # rank 2's watch is held back this long after rank 2 began the shrink

_JOB = """
import os, signal, sys, threading, time
from datetime import timedelta
import torch
import torch.distributed as dist
import ndist.torch
from ndist.torch import _watch
from ndist.torch._compiled import python_group  # (the Python group under either backend)

TIMEOUT_S, HOLD_S = float(sys.argv[1]), float(sys.argv[2])
torch.set_num_threads(1)
me = int(os.environ["RANK"])
got = {}
start = _watch.start

def started(store, *args):  # the default group's store (ndist's form), and rank 3 dies here
    start(store, *args)
    got["store"] = store
    if me == 3:  # the watch is up; the group's backend (its address) is not
        store.wait(["pending/posted"])
        store.set("pending/killed", "1")
        os.kill(os.getpid(), signal.SIGKILL)

_watch.start = started
dist.init_process_group("ndist", init_method="ndist://", timeout=timedelta(seconds=TIMEOUT_S))
store = got["store"]
nd = python_group(dist.distributed_c10d._get_default_group()).ndist_group
pending = []
if me == 2:  # the watch's thread is held back from telling the loss
    asked = threading.Event()
    watch = _watch._job.watch
    told = watch.on_loss

    def held(*args):
        asked.wait(60)
        time.sleep(HOLD_S)
        told(*args)

    watch.on_loss = held
    pending = [dist.isend(torch.arange(4, dtype=torch.float32), dst=3),
               dist.irecv(torch.empty(4), src=3)]
    store.set("pending/posted", "1")
    store.wait(["pending/killed", "pending/saw/0", "pending/saw/1"])
    # the case: neither the watch's record nor the group's holds the loss, the ops still wait
    print(f"knew {sorted(_watch._job.lost)} {sorted(nd.lost_members())} "
          f"{[w.is_completed() for w in pending]}".replace(", ", ","), flush=True)
    asked.set()
else:
    deadline = time.monotonic() + 30
    while 3 not in _watch._job.lost:
        assert time.monotonic() < deadline, "rank 3's loss was never told"
        time.sleep(0.01)
    store.set(f"pending/saw/{me}", "1")
t0 = time.monotonic()
dist.shrink_group([3])
print(f"shrink {time.monotonic() - t0:.2f}", flush=True)
y = torch.full((4,), float(me + 1))
dist.all_reduce(y)
print(f"result {dist.get_world_size()} {dist.get_rank()} {y[0].item():g} {time.monotonic() - t0:.2f}", flush=True)
for w in pending:  # failed at the shrink, naming rank 3
    try:
        w.wait()
        print("pending completed", flush=True)
    except Exception as err:
        print(f"pending {type(err).__name__} {type(err.__cause__).__name__} {getattr(err, 'failed_ranks', None)}"
              .replace(", ", ","), flush=True)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.parametrize("transport,engine", [("tcp", "python"), ("auto", "native")])
def test_a_torch_shrink_does_not_wait_for_operations_pending_on_an_excluded_rank(tmp_path, transport, engine):
    from tests.reliability.rank_loss_jobs import run_job

    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(_JOB))
    ended = run_job(str(script), 4, [_TIMEOUT_S, _HOLD_S],
                    env={"NDIST_TRANSPORT": transport, "NDIST_ENGINE": engine}, timeout=90)
    assert ended[3].code == -signal.SIGKILL, [e.code for e in ended]
    two = ended[2].out + ended[2].err
    assert "knew [] [] [False,False]" in ended[2].out, two[-4000:]  # the case: not known yet, both pending
    for rank in (0, 1, 2):
        e = ended[rank]
        assert e.code == 0, (rank, (e.out + e.err)[-4000:])
        assert f"result 3 {rank} 6 " in e.out, (rank, (e.out + e.err)[-4000:])  # 1 + 2 + 3
    took = float(next(ln for ln in ended[2].out.splitlines() if ln.startswith("shrink")).split()[1])
    assert took < _TIMEOUT_S / 2, two[-4000:]  # not the group timeout
    pending = [ln for ln in ended[2].out.splitlines() if ln.startswith("pending")]
    assert pending == ["pending DistNetworkError DistRankFailureError [3]"] * 2, two[-4000:]
