"""A peer lost in a subgroup is named by its global rank (the rank ndistrun, the
user's code and every other message use), not by its rank within the group.

Found by tools/trials/kill_trials.py (seed 1, tcp, native engine): with rank 2 of 4
killed, a survivor in group [0, 2] raised ``lost point-to-point connection to rank 1``
with ``.rank == 1``, naming a live rank (global rank 1) instead of the dead one."""

from datetime import timedelta

import numpy as np
import pytest

import ndist.distributed as dist
from tests.kill_sync import all_past, kill_self, run_with_victim
from tests.reliability.survivor_records import record_of


def _job(rank, size, out, what, me, victim):  # the group: [me, victim]
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # rank ``me`` stays to report; the launcher SIGKILLs after its grace
    dist.init_process_group("socket", timeout=timedelta(seconds=20))
    g = dist.new_group([me, victim])  # group rank 1 is global rank `victim`
    if rank in (me, victim):
        x = np.ones(8)
        dist.all_reduce(x, group=g)  # the group's mesh is up
        peer = me + victim - rank
        dist.send(np.full(4, float(rank)), dst=peer, group=g)  # and its point-to-point streams
        dist.recv(np.zeros(4), src=peer, group=g)
    dist.barrier()
    all_past(out, rank, 3, victim=victim)
    if rank == victim:
        kill_self(out)
    if rank != me:
        return None
    if what == "recv":
        return record_of(lambda: dist.recv(np.zeros(4), src=victim, group=g))
    return record_of(lambda: dist.all_reduce(np.ones(8), group=g))


@pytest.mark.timeout(90)
@pytest.mark.parametrize("what,transport,engine,group", [
    ("all_reduce", "tcp", "python", (0, 2)), ("all_reduce", "auto", "native", (0, 2)), ("recv", "auto", "python", (0, 2)),
    # the survivor is group rank 0 but global rank 1: "during rank 1: ..."
    ("all_reduce", "shm", "python", (1, 2)), ("all_reduce", "auto", "native", (1, 2)), ("recv", "tcp", "python", (1, 2)),
])
def test_a_peer_lost_in_a_subgroup_is_named_by_its_global_rank(tmp_path, what, transport, engine, group):
    me, victim = group
    out = run_with_victim(_job, 3, victim, tmp_path, what, me, victim, NDIST_TRANSPORT=transport, NDIST_ENGINE=engine)
    assert out.launcher_exitcode != 0, out
    rec = out[me]
    assert rec["type"] in ("DistRankFailureError", "DistNetworkError"), rec
    assert rec["peer"] == victim, rec  # global rank 2 died; global rank 1 is its group rank
    assert f"rank {victim}" in rec["msg"], rec
    if me == 0:
        assert "rank 1" not in rec["msg"], rec  # global rank 1 is alive and not in the group
    else:  # the survivor's group rank (0) is named nowhere; where it reports, it is rank 1
        assert "rank 0" not in rec["msg"], rec
        assert "during" not in rec["msg"] or "during rank 1: " in rec["msg"], rec
