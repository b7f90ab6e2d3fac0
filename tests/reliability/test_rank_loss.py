"""A job that survives a rank loss (docs/errors.md, "Rank loss"): every member watched
from init_process_group on, the loss named within 1 s with how it happened (died,
exited, left), the group revoked (every later op raises the same DistRankFailureError),
and shrink_group, on both engines.

Every job runs real processes over real sockets and shared memory; the store is hosted
by the test (as ndistrun's agent hosts it), so it outlives the victims."""

import os
import sys
import textwrap
import time

import pytest

from ndist.testing import run_ranks

from tests.reliability.rank_loss_jobs import run_job  # noqa: E402
from tests.reliability.shrink_scenarios import check_lost_during_shrink, lost_during_shrink, run

ENGINES = ["native", "python"]

# ------------------------------------------------------------------ detection, before any link
_EARLY = """
import os, signal, sys, time
import numpy as np
import ndist.distributed as dist

how = sys.argv[1]
dist.init_process_group("socket")
rank = dist.get_rank()
if rank == 0:
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "destroy":
        dist.destroy_process_group()
    if how == "bad-argument":
        try:  # a one-sided bad argument: refused before any byte is sent ...
            dist.broadcast(np.ones(4, dtype=">f4"), src=0)
        except TypeError as err:
            print("refused:", type(err).__name__, flush=True)
    sys.exit(0)  # ... then the script ends (no destroy_process_group)
time.sleep(0.5)  # rank 0 is gone by now
t0 = time.monotonic()
try:
    dist.broadcast(np.zeros(4, dtype=np.float32), src=0)
    print("no error", flush=True)
except dist.DistRankFailureError as err:
    print(f"took {time.monotonic() - t0:.3f} failed={err.failed_ranks} causes={err.causes} rank={err.rank}", flush=True)
    print("message:", err, flush=True)
t0 = time.monotonic()
try:  # revoked: the next op, p2p too, fails at once with the same error
    dist.send(np.zeros(1, dtype=np.float32), dst=0)
except dist.DistRankFailureError as err:
    print(f"again took {time.monotonic() - t0:.3f} failed={err.failed_ranks}", flush=True)
print("get_failed_ranks", dist.get_failed_ranks(), flush=True)
"""


def _field(out: str, key: str) -> str:
    line = next((ln for ln in out.splitlines() if ln.startswith(key)), None)
    assert line is not None, out
    return line


@pytest.mark.timeout(90)
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("how,cause", [("exit", "exited"), ("kill", "died"), ("destroy", "left"),
                                       ("bad-argument", "exited")])
def test_a_member_gone_before_the_first_collective_is_named_at_once(tmp_path, engine, how, cause):
    script = tmp_path / "early.py"
    script.write_text(textwrap.dedent(_EARLY))
    ends = run_job(str(script), 2, [how], env={"NDIST_ENGINE": engine})
    survivor = ends[1]
    assert survivor.code == 0, survivor.err[-3000:]
    took = _field(survivor.out, "took")
    assert float(took.split()[1]) < 1.0, took
    assert "failed=[0]" in took and f"causes=['{cause}']" in took and "rank=0" in took, took
    assert "rank 0 (" in survivor.out and cause in _field(survivor.out, "message:")
    again = _field(survivor.out, "again took")
    assert float(again.split()[2]) < 0.1 and "failed=[0]" in again, again
    assert "get_failed_ranks [0]" in survivor.out
    if how == "bad-argument":
        assert "refused: TypeError" in ends[0].out


# ------------------------------------------------------------------ revoke, on every kind of op
def _revoke_job(rank, size):
    import os
    import signal
    import time

    import numpy as np

    import ndist.distributed as dist
    from ndist.runtime._world import _world
    from tests.kill_sync import all_past

    x = np.ones(1024, dtype=np.float32)
    dist.all_reduce(x)  # links exist
    all_past(_world.job_store, rank, size, victim=1)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    # the group knows of the loss (the member watch told it: it is revoked) before the ops
    # run; a fixed sleep raced the watch on a loaded machine
    deadline = time.monotonic() + 10
    while 1 not in dist.get_failed_ranks() and time.monotonic() < deadline:
        time.sleep(0.01)
    out = {}
    ops = {
        "all_reduce": lambda: dist.all_reduce(x),
        "async all_reduce": lambda: dist.all_reduce(x, async_op=True).wait(),
        "broadcast_object_list": lambda: dist.broadcast_object_list([1], src=0),
        "barrier": lambda: dist.barrier(),
        "monitored_barrier": lambda: dist.monitored_barrier(wait_all_ranks=True),
        "send to a survivor": lambda: dist.send(x, dst=2 if rank == 0 else 0),
        "recv": lambda: dist.recv(x, src=1),
    }
    for name, op in ops.items():
        t0 = time.monotonic()
        try:
            op()
            out[name] = "no error"
        except dist.DistError as err:
            out[name] = (type(err).__name__, getattr(err, "failed_ranks", None), round(time.monotonic() - t0, 3),
                         getattr(err, "causes", None))
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("engine", ENGINES)
def test_every_op_on_a_revoked_group_raises_the_rank_failure_at_once(engine):
    res = run_ranks(_revoke_job, 3, timeout=90, may_die=[1], env={"NDIST_ENGINE": engine})
    assert res[1] is None
    for rank in (0, 2):
        for name, got in res[rank].items():
            assert got != "no error", (rank, name)
            kind, failed, took, causes = got
            # the other survivor may finish its ops and leave first (run_ranks destroys its group):
            # it is then lost too, as left or exited
            lost = dict(zip(failed, causes))
            assert kind == "DistRankFailureError" and lost.pop(1) == "died", (rank, name, got)
            assert set(lost.values()) <= {"exited", "left"}, (rank, name, got)
            assert took < 1.0, (rank, name, got)


# ------------------------------------------------------------------ shrink_group
def _shrink_job(rank, size, victims, explicit):
    import os
    import signal
    import time

    import numpy as np

    import ndist.distributed as dist
    from ndist.runtime._world import _world
    from tests.kill_sync import all_past

    x = np.full(8, float(rank + 1), dtype=np.float32)
    dist.all_reduce(x)
    sub = dist.new_group([0, 1, 2])  # destroyed by a shrink of the default group, as in torch
    all_past(_world.job_store, rank, size, victim=victims)
    if rank in victims:
        os.kill(os.getpid(), signal.SIGKILL)
    t_lost = time.monotonic()
    try:
        while True:
            dist.all_reduce(x)
    except dist.DistRankFailureError as err:
        seen = err.failed_ranks
    new = dist.shrink_group(explicit if rank == 0 else None)
    y = np.full(8, float(rank + 1), dtype=np.float32)
    dist.all_reduce(y)
    recovered = time.monotonic() - t_lost
    # a new group and a split work on the shrunk world (its ranks renumbered)
    pair = dist.new_group([0, 1])
    z = np.ones(2, dtype=np.float32)
    if pair.rank() >= 0:
        dist.all_reduce(z, group=pair)
    failed_after = dist.get_failed_ranks()
    dist.barrier()  # (no survivor leaves, and is seen leaving, before every survivor looked)
    return {"seen": seen, "rank": dist.get_rank(), "size": dist.get_world_size(),
            "is_default": new.rank() == dist.get_rank() and new.size() == dist.get_world_size(),
            "sum": float(y[0]), "pair": float(z[0]), "sub_destroyed": sub.destroyed, "recovered": recovered,
            "failed_after": failed_after}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("victims,explicit", [([2], None), ([1, 3], None), ([3], [3])])
def test_survivors_shrink_and_carry_on(engine, victims, explicit):
    size = 4
    res = run_ranks(_shrink_job, size, args=(victims, explicit), timeout=120, may_die=victims,
                    env={"NDIST_ENGINE": engine})
    survivors = [r for r in range(size) if r not in victims]
    want_sum = float(sum(r + 1 for r in survivors))
    for new_rank, r in enumerate(survivors):
        got = res[r]
        assert got["rank"] == new_rank and got["size"] == len(survivors) and got["is_default"], got
        assert got["sum"] == want_sum, got
        assert got["sub_destroyed"] and got["failed_after"] == [], got
        assert set(got["seen"]) <= set(victims) and got["seen"], got
        if new_rank < 2:
            assert got["pair"] == 2.0, got
        assert got["recovered"] < 5.0, got


def _bad_shrink_job(rank, size):
    import numpy as np

    import ndist.distributed as dist

    out = {}
    cases = {
        "out of range": ([4], ValueError),
        "negative": ([-1], ValueError),
        "duplicate": ([1, 1], ValueError),
        "every rank": ([0, 1, 2, 3], ValueError),
        "itself": ([rank], ValueError),
        "not a list": (3, TypeError),
        "not ints": (["1"], TypeError),
        "empty": ([], ValueError),
    }
    for name, (arg, kind) in cases.items():
        try:
            dist.shrink_group(arg)
            out[name] = "accepted"
        except kind as err:
            out[name] = str(err)
    try:
        dist.shrink_group(None, shrink_flags=7)
        out["flags"] = "accepted"
    except ValueError as err:
        out["flags"] = str(err)
    # every rank alive: excluding rank 3, which calls shrink_group too, is refused everywhere
    try:
        dist.shrink_group([3] if rank != 3 else [0], )
        out["alive"] = "accepted"
    except ValueError as err:
        out["alive"] = str(err)
    x = np.ones(4, dtype=np.float32)
    dist.all_reduce(x)  # nothing changed: the group works
    out["after"] = (float(x[0]), dist.get_world_size())
    return out


@pytest.mark.timeout(120)
def test_bad_shrink_arguments_are_refused_and_nothing_changes():
    res = run_ranks(_bad_shrink_job, 4, timeout=90)
    for rank, out in enumerate(res):
        assert "[0, 4)" in out["out of range"] and "got 4" in out["out of range"], out
        assert "got -1" in out["negative"]
        assert "twice" in out["duplicate"]
        assert "all of them" in out["every rank"]
        assert f"this rank ({rank})" in out["itself"]
        assert "ranks_to_exclude" in out["not a list"] and "int" in out["not a list"]
        assert "str" in out["not ints"]
        assert "got []" in out["empty"]
        assert "shrink_flags" in out["flags"] and "got 7" in out["flags"]
        assert "alive" in out["alive"], out
        assert out["after"] == (4.0, 4)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("engine", ENGINES)
def test_a_loss_during_the_shrink_makes_the_agreement_repeat(engine):
    # rank 2 dies once it posted what it saw, at its first pause or as it adopts the decision
    res = run(lost_during_shrink, "ndist", 4, "pause", victims=[2, 3], engine=engine, timeout=120)
    check_lost_during_shrink(res, "ndist")
