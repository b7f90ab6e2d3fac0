"""``torch.distributed.shrink_group`` on the default group of backend "ndist": a survivor
that begins it tells every other process, and revokes its other groups, when any of its
groups knows a loss, not only when the default group's own record holds it (issue 29; the
torch twin of tests/reliability/test_shrink_told_by_any_group.py).

4 ranks, the test hosts the store (``ndist://``), subgroups [0, 1] and [1, 2, 3], no
collective on the world before the loss. Rank 0 waits in the first op of [0, 1] (its set-up
waits for rank 1's address); rank 2 is SIGKILLed; ranks 1 and 3 learn of it in [1, 2, 3] and
call ``shrink_group([2])``. On rank 1 neither the torch job's member watch
(``ndist/torch/_watch.py``) nor the subgroup's socket backend has told the default group yet
(every torch group's backend exists from its creation, and a backend that finds a loss tells
the process's other groups, ``GroupFailure``'s spread, after failing its own waiters): both
are held back for 3 s after rank 1 learnt of the loss (as a loaded machine may hold them), so
only the subgroup knows it. Before
the fix rank 1's ``begin_default_shrink`` found the default group's record empty and told
nobody: rank 0 was never released (rank 3's notice does not concern [0, 1]) and waited out
the group timeout. Now rank 1 tells at once: rank 0's op raises ``DistRankFailureError``
naming rank 2, and the three finish on a group of three."""

import signal
import sys
import textwrap

import pytest

pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]

_HOLD_S = 3.0  # rank 1's watch is held back this long after rank 1 learnt of the loss

_JOB = """
import os, signal, sys, threading, time
from datetime import timedelta
import torch
import torch.distributed as dist
import ndist.torch
from ndist.torch import _watch
from ndist.torch._compiled import python_group  # (the Python group under either backend)

HOLD_S = float(sys.argv[1])
torch.set_num_threads(1)
dist.init_process_group("ndist", init_method="ndist://", timeout=timedelta(seconds=10))
me = dist.get_rank()
store = dist.distributed_c10d._get_default_store()
nd = python_group(dist.distributed_c10d._get_default_group()).ndist_group
sub01 = dist.new_group([0, 1])
sub123 = dist.new_group([1, 2, 3])
x = torch.ones(4)
if me in (1, 2, 3):
    dist.all_reduce(x, group=sub123)  # the subgroup's links exist
if me == 1:  # the watch's thread is held back from telling the loss
    learnt = threading.Event()
    watch = _watch._job.watch
    told = watch.on_loss

    def held(*args):
        learnt.wait(60)
        time.sleep(HOLD_S)
        told(*args)

    watch.on_loss = held
    # ... and so is the subgroup backend's telling of this process's other groups (the default
    # group's backend among them) of a loss it found: it runs after the subgroup's waiters are
    # failed, so the op raises first (on its own thread here, as when another thread found it)
    failure = python_group(sub123).ndist_group.backend_for("cpu").failure
    spread = failure._spread

    def spread_later(*args):
        threading.Thread(target=held_spread, args=args, daemon=True).start()

    def held_spread(*args):
        learnt.wait(60)
        time.sleep(HOLD_S)
        spread(*args)

    failure._spread = spread_later
    store.set("anyloss/held", "1")
if me == 2:
    store.wait(["anyloss/held", "anyloss/waiting"])
    time.sleep(0.3)  # rank 0 is in the subgroup's set-up by now
    store.set("anyloss/killed", repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)
if me == 0:  # waits in [0, 1] for rank 1's address; rank 1 never joins
    store.set("anyloss/waiting", "1")
    try:
        dist.all_reduce(torch.ones(4), group=sub01)
        print("sub no error", flush=True)
    except Exception as err:
        cause = type(err.__cause__).__name__ if err.__cause__ is not None else type(err).__name__
        print(f"sub {cause} {getattr(err, 'failed_ranks', None)} {getattr(err, 'rank', None)}".replace(", ", ","),
              flush=True)
        print(f"message {err}".replace(chr(10), " "), flush=True)
    print(f"took {time.time() - float(store.get('anyloss/killed')):.2f}", flush=True)
else:
    try:
        while True:
            dist.all_reduce(x, group=sub123)
    except Exception as err:
        print(f"sub {type(err.__cause__).__name__} {getattr(err, 'failed_ranks', None)}".replace(", ", ","),
              flush=True)
    if me == 1:
        # only the subgroup knows the loss here: neither the watch's record nor the default group's
        print(f"world knew {sorted(_watch._job.lost)} {sorted(nd.lost_members())}".replace(", ", ","), flush=True)
        learnt.set()
t0 = time.monotonic()
dist.shrink_group([2])
y = torch.full((4,), float(me + 1))
dist.all_reduce(y)
print(f"result {dist.get_world_size()} {dist.get_rank()} {y[0].item():g} {time.monotonic() - t0:.2f}", flush=True)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.parametrize("transport,engine", [("tcp", "python"), ("auto", "native")])
def test_a_torch_shrink_begun_on_a_loss_only_a_subgroup_knows_tells_the_others(tmp_path, transport, engine):
    from tests.reliability.rank_loss_jobs import run_job

    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(_JOB))
    ended = run_job(str(script), 4, [_HOLD_S], env={"NDIST_TRANSPORT": transport, "NDIST_ENGINE": engine},
                    timeout=90)
    assert ended[2].code == -signal.SIGKILL, [e.code for e in ended]
    one = ended[1].out + ended[1].err
    assert "sub DistRankFailureError [1]" in ended[1].out, one[-4000:]  # rank 2 is group rank 1 of [1, 2, 3]
    assert "world knew [] []" in ended[1].out, one[-4000:]  # the case: the default group did not know yet
    zero = ended[0].out + ended[0].err
    assert "sub DistRankFailureError [] 2" in ended[0].out, zero[-4000:]
    message = next(ln for ln in ended[0].out.splitlines() if ln.startswith("message"))
    assert "shrink_group" in message, message
    took = float(next(ln for ln in ended[0].out.splitlines() if ln.startswith("took")).split()[1])
    assert took < _HOLD_S, zero[-4000:]  # released by rank 1's shrink, not by any timeout
    for rank, new_rank in ((0, 0), (1, 1), (3, 2)):
        e = ended[rank]
        assert e.code == 0, (e.out + e.err)[-4000:]
        assert f"result 3 {new_rank} 7 " in e.out, (e.out + e.err)[-4000:]  # 1 + 2 + 4
