"""A stopped (SIGSTOP) rank and a chain of waiters across groups and point to point:
survivor A (rank 0) waits on survivor B (rank 1), and B is stuck with the stopped rank
S (rank 2) in *another* group, or in a receive, or A waits in a receive (kill trials,
seeds 2025, 2028, 2030: A named B). A deadline passed anywhere in B's process is told
by every group of that process and on its point-to-point streams (``_stalls``), and a
receive whose deadline passes gives such notices the same grace as a collective: A's
``DistTimeoutError`` names S, the root cause, within the group timeout + the grace."""

import os
import time
from datetime import timedelta

import pytest

from ndist.testing import run_ranks
from tests.reliability.stopped_groups import A, B, S, TIMEOUT, join_with_bs
from tests.stopped_ranks import finish, not_heard_from


def _across(rank, size, folder, case, late):
    import signal

    import numpy as np

    import ndist.distributed as dist

    dist.init_process_group("socket", timeout=timedelta(seconds=TIMEOUT))
    bs = dist.new_group([B, S])
    ab = dist.new_group([A, B])
    x = np.full(8, rank + 1.0)
    dist.all_reduce(x)  # every group's connections are up
    if rank in (B, S):
        dist.all_reduce(x, group=bs)
    if rank in (A, B):
        dist.all_reduce(x, group=ab)
    # point-to-point streams up between every pair (but B and S in the "cold" case: B's
    # receive dials S, which accepts and never answers the handshake)
    pairs = [(A, B), (B, A), (B, S), (S, B), (A, S), (S, A)]
    if case == "recv-cold-world":
        pairs = [(p, q) for p, q in pairs if {p, q} != {B, S}]
    for p, q in pairs:
        if rank == p:
            dist.send(np.full(4, 1.0 * p), dst=q, tag=7)
    for p, q in pairs:
        if rank == q:
            z = np.zeros(4)
            dist.recv(z, src=p, tag=7)
    pids = [None] * size
    dist.all_gather_object(pids, os.getpid())
    dist.barrier()
    if rank == S:
        os.kill(os.getpid(), signal.SIGSTOP)  # A continues it once A and B have raised
        return ("stopped", None, None, None)
    if rank == late:
        time.sleep(0.15)
    t0 = time.monotonic()
    outcome = ("ok", None, None, None)
    y = np.zeros(8)
    try:
        if rank == B:
            if case in ("sub-world", "sub-recv", "sub-irecv"):
                dist.all_reduce(x, group=bs)  # waits on S in a subgroup
            elif case == "world-sub":
                dist.scatter(y, None, src=S)  # waits on S (only) in the world
            elif case in ("recv-world", "recv-cold-world"):
                dist.recv(y, src=S)  # waits on S point to point
        else:
            if case in ("sub-world", "recv-world", "recv-cold-world"):
                dist.scatter(y, None, src=B)  # waits on B (only) in the world
            elif case == "world-sub":
                dist.all_reduce(x, group=ab)  # waits on B in a subgroup
            elif case == "sub-recv":
                dist.recv(y, src=B)
            elif case == "sub-irecv":
                dist.irecv(y, src=B).wait()
    except dist.DistError as err:
        outcome = (type(err).__name__, str(err), time.monotonic() - t0, getattr(err, "rank", None))
    finish(folder, rank, (A, B), A, pids[S])  # (B stays until A has raised: its exit would reset A's streams)
    return outcome


CASES = {
    "sub-world": "B waits on S in group [1, 2]; A waits on B in a world scatter",
    "world-sub": "B waits on S in a world scatter; A waits on B in group [0, 1]",
    "recv-world": "B waits in a recv from S; A waits on B in a world scatter",
    "recv-cold-world": "B waits in a recv from S, with no stream to it yet; A waits on B in a world scatter",
    "sub-recv": "B waits on S in group [1, 2]; A waits in a recv from B",
    "sub-irecv": "B waits on S in group [1, 2]; A waits in irecv(B).wait()",
}


# Every case with A's deadline first (A waits in its grace for B's notice: the harder
# path); B's notice first only for one group case and one receive case (the suite's
# time: each case waits out the 3 s group timeout).
_LATE = [(case, B, "waiter-first") for case in CASES] + [
    (case, A, "waited-first") for case in ("sub-world", "sub-recv")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport,engine", [("tcp", "python"), ("shm", "python"), ("auto", "native")])
@pytest.mark.parametrize("case,late", [c[:2] for c in _LATE], ids=[f"{c[0]}-{c[2]}" for c in _LATE])
def test_a_survivor_names_the_stopped_rank_its_peer_waits_on_elsewhere(tmp_path, case, transport, engine, late):
    """late=B: B enters 0.15 s late, so A's deadline passes first and A waits in its grace
    for B's notice; late=A: B's notice is there before A's deadline passes."""
    if engine == "native":
        pytest.importorskip("ndist.collectives.backends.socket.native._cnative")
    res = run_ranks(_across, 3, args=(str(tmp_path), case, late), init=False, timeout=90,
                    env={"NDIST_TRANSPORT": transport, "NDIST_ENGINE": engine})
    kind, msg, waited, err_rank = res[B]
    assert kind == "DistTimeoutError" and not_heard_from(msg) == [S], (CASES[case], res[B])
    kind, msg, waited, err_rank = res[A]
    assert kind == "DistTimeoutError", (CASES[case], res[A])
    assert not_heard_from(msg) == [S], (CASES[case], res[A])
    assert f"rank {B} (" in msg and "waited on it" in msg, (CASES[case], res[A])
    assert err_rank in (None, S), res[A]
    assert 2.4 < waited < TIMEOUT + 0.3 + 2.0, res[A]  # the group timeout + at most the 0.3 s grace (+ load)


def _connect_chain(rank, size, folder, stopped, late):
    """B (rank 1)'s first collective on group [1, stopped] connects to the stopped rank;
    the other survivor (``waiter``) waits on B in a world scatter."""
    import signal

    import numpy as np

    import ndist.distributed as dist

    dist.init_process_group("socket", timeout=timedelta(seconds=TIMEOUT))
    waiter = 2 if stopped == 0 else 0
    sub = dist.new_group(sorted([B, stopped]))  # no collective before the stop: B connects it then
    x = np.full(8, rank + 1.0)
    dist.all_reduce(x)
    if rank == stopped:  # (its address is published: B's dial reaches its listener)
        dist.send(x, dst=B, group=sub)
    elif rank == B:
        dist.recv(np.zeros(8), src=stopped, group=sub)
    pids = [None] * size
    dist.all_gather_object(pids, os.getpid())
    dist.barrier()
    if rank == stopped:
        os.kill(os.getpid(), signal.SIGSTOP)
        return ("stopped", None, None, None)
    if rank == late:
        time.sleep(0.15)
    t0 = time.monotonic()
    outcome = ("ok", None, None, None)
    try:
        if rank == B:
            dist.all_reduce(x, group=sub)
        else:
            dist.scatter(np.zeros(8), None, src=B)
    except dist.DistError as err:
        outcome = (type(err).__name__, str(err), time.monotonic() - t0, getattr(err, "rank", None))
    finish(folder, rank, (B, waiter), waiter, pids[stopped])
    return outcome


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stopped", [0, 2], ids=["B-dials-it", "B-waits-for-its-dial"])
@pytest.mark.parametrize("transport,engine", [("tcp", "python"), ("auto", "native")])
def test_a_group_set_up_with_a_stopped_member_times_out_and_tells(tmp_path, transport, engine, stopped):
    """B's first collective on a group with the stopped rank: B dials it (it accepts and
    never answers the handshake: before, B raised DistNetworkError calling it lost) or
    waits for its dial (kill trial seed 2031). B raises DistTimeoutError naming it, and
    the survivor waiting on B names it too."""
    if engine == "native":
        pytest.importorskip("ndist.collectives.backends.socket.native._cnative")
    waiter = 2 if stopped == 0 else 0
    res = run_ranks(_connect_chain, 3, args=(str(tmp_path), stopped, B), init=False, timeout=90,
                    env={"NDIST_TRANSPORT": transport, "NDIST_ENGINE": engine})
    kind, msg, waited, err_rank = res[B]
    assert kind == "DistTimeoutError", res[B]
    assert not_heard_from(msg) == [stopped] or f"ranks [{stopped}] did not connect" in msg, res[B]
    kind, msg, waited, err_rank = res[waiter]
    assert kind == "DistTimeoutError", res[waiter]
    assert not_heard_from(msg) == [stopped], res[waiter]
    assert f"rank {B} (" in msg and "waited on it" in msg, res[waiter]
    assert 2.4 < waited < TIMEOUT + 0.3 + 2.0, res[waiter]


def _stale_notice(rank, size):
    """B times out in group [1, 2] (rank 2 is late there): its notice reaches the world.
    B then goes on in the world (a healthy all_reduce), and later is slow in another world
    op: A's timeout there names B, not the rank of B's old notice."""
    import numpy as np

    dist, bs, x = join_with_bs(rank)
    dist.barrier()
    first = None
    if rank == B:
        try:
            dist.all_reduce(x, group=bs)  # S never comes: B times out, tells the world
        except dist.DistTimeoutError as err:
            first = str(err)
    else:
        time.sleep(1.0)  # (A's and S's deadlines for the next op fall after B has come)
    y = np.ones(4)
    dist.all_reduce(y)  # healthy: B comes after its timeout, within A's and S's deadlines
    if rank == B:
        time.sleep(TIMEOUT + 0.5)  # slow here: A and S time out waiting on B
    t0 = time.monotonic()
    try:
        dist.all_reduce(x)
        second = None
    except dist.DistError as err:
        second = (type(err).__name__, str(err), time.monotonic() - t0)
    return first, y.tolist(), second


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport,engine", [("tcp", "python"), ("auto", "native")])
def test_a_notice_from_another_group_is_dropped_once_its_rank_goes_on(transport, engine):
    if engine == "native":
        pytest.importorskip("ndist.collectives.backends.socket.native._cnative")
    res = run_ranks(_stale_notice, 3, init=False, timeout=90,
                    env={"NDIST_TRANSPORT": transport, "NDIST_ENGINE": engine})
    assert res[B][0] is not None and not_heard_from(res[B][0]) == [S], res[B]
    for rank in range(3):
        assert res[rank][1] == [3.0] * 4, res  # the op after B's timeout works on every rank
    kind, msg, waited = res[A][2]
    assert kind == "DistTimeoutError" and not_heard_from(msg) == [B], res[A]  # not [S]: B went on
    assert "waited on" not in msg, res[A]


def _send_behind(rank, size, folder):
    """Rank 1 isends 64 MB to the stopped rank 2 (it blocks: nobody reads), then sends a
    small message to rank 0: that blocking send is queued behind the first."""
    import signal

    import numpy as np

    import ndist.distributed as dist

    dist.init_process_group("socket", timeout=timedelta(seconds=TIMEOUT))
    small = np.ones(4)
    if rank == B:  # the streams are up before the stop
        dist.send(small, dst=S)
        dist.send(small, dst=A)
    elif rank in (A, S):
        dist.recv(np.zeros(4), src=B)
    pids = [None] * size
    dist.all_gather_object(pids, os.getpid())
    dist.barrier()
    outcome = None
    if rank == S:
        os.kill(os.getpid(), signal.SIGSTOP)
    elif rank == B:
        big = dist.isend(np.ones(1 << 23), dst=S)
        try:
            dist.send(small, dst=A)
        except dist.DistError as err:
            outcome = (type(err).__name__, str(err))
        with open(os.path.join(folder, "done"), "w"):
            pass
        del big
    else:
        deadline = time.monotonic() + 30
        while not os.path.exists(os.path.join(folder, "done")) and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(pids[S], signal.SIGCONT)
    return outcome


@pytest.mark.timeout(120)
def test_a_blocking_send_queued_behind_a_send_to_a_stopped_rank_names_it(tmp_path):
    """Kill trial seeds 5203 and 2031: the blocking send's timeout said only `send (#-1) did
    not complete within 3 s`."""
    res = run_ranks(_send_behind, 3, args=(str(tmp_path),), init=False, timeout=90,
                    env={"NDIST_TRANSPORT": "tcp", "NDIST_ENGINE": "python"})
    kind, msg = res[B]
    assert kind == "DistTimeoutError", res[B]
    assert "queued behind a send: sending to rank 2 (tag 0); ranks not heard from: [2]" in msg, res[B]
