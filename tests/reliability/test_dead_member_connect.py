"""Building a group's connections with a member that is already dead fails at once,
naming it, instead of waiting the group timeout.

Found by tools/trials/kill_trials.py: a survivor's first collective on a subgroup whose
other member had died raised, after the whole group timeout, ``ranks [1] did not
connect within the timeout`` or ``could not connect to rank 2 ... Connection
refused``. A peer still starting refuses connections too, so a refusal alone is no
proof; the runtime fails at once only where it knows: the member runs on this host
and its process is gone, or this process already recorded its loss (in another
group)."""

import os
import signal
import time
from datetime import timedelta

import numpy as np
import pytest

import ndist.distributed as dist
from tests.kill_sync import all_past, kill_self, killed_at, run_with_victim
from tests.reliability.survivor_records import record_of


def _launch(tmp_path, job, victim: int, *args, term_timeout: float = 30, **env):
    """Run ``job`` on 3 ranks under ndistrun (it must fail: ``victim`` is killed); the
    results by rank (the victim's None) and the kill time."""
    out = run_with_victim(job, 3, victim, tmp_path, *args, term_timeout=term_timeout, **env)
    assert out.launcher_exitcode != 0, out
    assert (tmp_path / "killed").exists(), out
    return out, killed_at(tmp_path)


def _names_at_once(rec: dict, victim: int, killed: float) -> None:
    assert rec["type"] in ("DistRankFailureError", "DistNetworkError"), rec
    assert rec["peer"] == victim and f"rank {victim}" in rec["msg"], rec
    assert rec["t"] - killed < 5, (rec["t"] - killed, rec)  # the group timeout is 20 s


def _gone(pid):  # (a zombie until the launcher reaps it: dead all the same)
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):  # (reaped, even mid-read)
        return True


def _job(rank, size, out, what, when, survivor, victim):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the survivor stays to report; the launcher SIGKILLs after its grace
    dist.init_process_group("socket", timeout=timedelta(seconds=20))
    dist.all_reduce(np.ones(8))  # the world group is connected: every rank knows every other's process
    g = dist.new_group(sorted((survivor, victim)))
    if when == "published" and rank == victim:
        dist.get_engine(g)  # its backend exists (its address is published), nothing is connected
    if rank == victim:
        with open(os.path.join(out, "victim_pid"), "w") as f:
            f.write(str(os.getpid()))
    dist.barrier()
    if rank == victim:
        kill_self(out)
    if rank != survivor:
        return None
    # its op starts once the victim is dead: a send racing the kill may reach it alive (and
    # return, delivered), which is not the case under test
    with open(os.path.join(out, "victim_pid")) as f:
        pid = int(f.read())
    deadline = time.monotonic() + 30
    while not _gone(pid):
        assert time.monotonic() < deadline, "the victim never died"
        time.sleep(0.001)
    if what == "all_reduce":
        return record_of(lambda: dist.all_reduce(np.ones(4), group=g))
    if what == "send":
        return record_of(lambda: dist.send(np.ones(4), dst=victim, group=g))
    return record_of(lambda: dist.recv(np.zeros(4), src=victim, group=g))


@pytest.mark.timeout(90)
@pytest.mark.parametrize("what,when,survivor,victim,transport", [
    ("all_reduce", "never", 0, 2, "tcp"),  # the survivor waits for the victim to dial; it never published
    ("all_reduce", "never", 2, 1, "auto"),  # the survivor dials a victim that never published
    ("all_reduce", "published", 0, 2, "auto"),  # it waits for a victim that published, then died
    ("all_reduce", "published", 1, 0, "tcp"),  # it dials a victim that published, then died: refused
    ("send", "published", 1, 0, "auto"),
    ("recv", "published", 1, 0, "tcp"),
])
def test_connecting_to_a_dead_member_fails_at_once_naming_it(tmp_path, what, when, survivor, victim, transport):
    out, killed = _launch(tmp_path, _job, victim, what, when, survivor, victim, NDIST_TRANSPORT=transport,
                          NDIST_ENGINE="python")
    _names_at_once(out[survivor], victim, killed)


# Rank 2 dies right after the group is made, before its first collective. Rank 0 waits
# in a broadcast from rank 1 only (its one link in the group); rank 1 opens its links to
# both receivers before it sends a byte, cannot open rank 2's (dead) and fails at once. It
# tells rank 0 (a "lost" notice on their link), so rank 0 fails at once naming rank 2, not
# at the group timeout, and without the broadcast's data.
def _half_built_job(rank, size, out):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stay to report; the launcher SIGKILLs after its grace
    dist.init_process_group("socket", timeout=timedelta(seconds=20))
    dist.all_reduce(np.ones(8))  # returned on rank 2: delivered to the others too, over shm as well
    g = dist.new_group([0, 1, 2])
    if rank == 2:
        kill_self(out)
    if rank == 1:
        time.sleep(0.5)  # rank 2 is gone, rank 0 waits
    rec = record_of(lambda: dist.broadcast(np.ones(4), src=1, group=g))
    # rank 1 stays until rank 0 has its record (its exit would show rank 0 a lost connection to rank 1)
    all_past(os.path.join(out, "recorded"), rank, [0], victim=1, timeout=25)
    return rec


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_rank_that_cannot_build_a_group_tells_the_members_waiting_on_it(tmp_path, transport):
    out, killed = _launch(tmp_path, _half_built_job, 2, term_timeout=40, NDIST_TRANSPORT=transport,
                          NDIST_ENGINE="python")
    for rank in (1, 0):
        rec = out[rank]
        assert rec["type"] in ("DistRankFailureError", "DistNetworkError") and rec["peer"] == 2 and "rank 2" in rec["msg"], (rank, rec)
        assert rec["t"] - killed < 5, (rank, rec["t"] - killed, rec)  # the group timeout is 20 s


# Kill trial seed 3059: in group [1, 2, 3], rank 1 died; rank 3 had learnt of it in
# another group and stopped calling, so it never published its address in this group;
# rank 2's send to rank 3 waited the whole group timeout for that address and raised
# naming rank 3. While a rank waits for a member's address it now also looks at the
# group's other members: one known dead fails the wait at once, naming it.
def _silent_member_job(rank, size, out):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stay to report; the launcher SIGKILLs after its grace
    dist.init_process_group("socket", timeout=timedelta(seconds=20))
    dist.all_reduce(np.ones(8))  # every rank knows every other's process
    g = dist.new_group([0, 1, 2])
    all_past(os.path.join(out, "past"), rank, 3, victim=0)  # (the victim dies once every rank is past the all_reduce)
    if rank == 0:  # the victim
        kill_self(out)
    if rank == 2:  # stops calling: never builds g, never publishes its address there
        # until rank 1 has reported (not a fixed 30 s: the job ends then)
        all_past(os.path.join(out, "recorded"), rank, [1], victim=2, timeout=30)
        return None
    time.sleep(0.5)  # rank 0 is gone
    rec = record_of(lambda: dist.send(np.ones(4), dst=2, group=g))
    all_past(os.path.join(out, "recorded"), rank, [1], victim=2)
    return rec


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_waiting_for_a_silent_members_address_fails_at_once_when_another_member_is_dead(tmp_path, transport):
    out, killed = _launch(tmp_path, _silent_member_job, 0, NDIST_TRANSPORT=transport)
    _names_at_once(out[1], 0, killed)


# Kill trial seed 3185 (auto transport): a member died while the group built its
# collective connections, after it published its address and before it published which
# peers' memory it can read; the others waited the group timeout for it. Links now agree
# on memory access as they open (``_links_wire``): the member dies probing it, in the
# middle of a link's opening, and the peers fail at once, naming it.
def _cma_key_job(rank, size, out):
    from ndist.collectives.backends.socket.wire import _cma

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stay to report; the launcher SIGKILLs after its grace
    dist.init_process_group("socket", timeout=timedelta(seconds=20))
    dist.all_reduce(np.ones(8))
    g = dist.new_group([0, 1, 2])
    if rank == 0:  # the victim: dies in g's set-up, probing a peer's memory
        _cma.can_read = lambda *args, **kwargs: kill_self(out)
    return record_of(lambda: dist.all_reduce(np.ones(4), group=g))


@pytest.mark.timeout(90)
def test_a_member_dying_before_it_publishes_its_memory_access_is_named_at_once(tmp_path):
    out, killed = _launch(tmp_path, _cma_key_job, 0, NDIST_TRANSPORT="auto", NDIST_ENGINE="python")
    for rank in (1, 2):
        _names_at_once(out[rank], 0, killed)
