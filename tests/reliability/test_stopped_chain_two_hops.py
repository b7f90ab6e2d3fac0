"""A stopped (SIGSTOP) rank at the end of a chain of *two* waiting survivors: rank 2 (C)
waits on the stopped rank 3 (S), rank 1 (B) waits on C, rank 0 (A) waits on B, every
deadline passing within a grace of the others (kill trial seed 7207: A named C, the
rank B's first notice named, before B learnt of C's). A rank's first notice names the
root it knows of so far and is refined in its grace; a waiter counts a first notice at
its grace's end and a final one (its sender raised) at once (``_engine_stall``): every
survivor's ``DistTimeoutError`` names S."""

import time
from datetime import timedelta

import pytest

from ndist.testing import run_ranks
from tests.stopped_ranks import finish, not_heard_from, open_streams, stop_one

A, B, C, S = 0, 1, 2, 3
TIMEOUT = 3.0


def _two_hops(rank, size, folder, case, delays):
    import numpy as np

    import ndist.distributed as dist

    dist.init_process_group("socket", timeout=timedelta(seconds=TIMEOUT))
    cs = dist.new_group([C, S])
    bc = dist.new_group([B, C])
    ab = dist.new_group([A, B])
    x = np.full(8, rank + 1.0)
    dist.all_reduce(x)  # every group's connections are up
    for grp, members in ((cs, (C, S)), (bc, (B, C)), (ab, (A, B))):
        if rank in members:
            dist.all_reduce(x, group=grp)
    open_streams(dist, rank, ((A, B), (B, A), (B, C), (C, B)))  # point-to-point streams up
    pids = stop_one(dist, rank, size, S)  # (a survivor continues S once all have raised)
    if rank == S:
        return ("stopped", None, None, None)
    time.sleep(delays[rank])
    t0 = time.monotonic()
    outcome = ("ok", None, None, None)
    y = np.zeros(8)
    try:
        if rank == C:
            dist.all_reduce(x, group=cs)  # waits on S
        elif rank == B:
            if case == "groups":
                dist.all_reduce(x, group=bc)  # waits on C, stuck in [2, 3]
            else:
                dist.recv(y, src=C)  # waits on C point to point
        elif case == "groups":
            dist.all_reduce(x, group=ab)  # waits on B, stuck in [1, 2]
        else:
            dist.scatter(y, None, src=B)  # waits on B (only) in the world
    except dist.DistError as err:
        outcome = (type(err).__name__, str(err), time.monotonic() - t0, getattr(err, "rank", None))
    finish(folder, rank, (A, B, C), A, pids[S])
    return outcome


CASES = {
    "groups": "C waits on S in [2, 3]; B on C in [1, 2]; A on B in [0, 1]",
    "recv": "C waits on S in [2, 3]; B in a recv from C; A on B in a world scatter (seed 7207's shape)",
}
# start delays of A, B, C. waiter-first: A's deadline passes first, then B's, which tells
# its first notice (naming C) while A is in its grace and before C's deadline passes (the
# order that failed); end-first: C's first, B's notice names S from the start.
ORDERS = {"waiter-first": (0.0, 0.05, 0.1, 0.0), "end-first": (0.1, 0.05, 0.0, 0.0)}
_RUNS = [(case, "waiter-first") for case in CASES] + [("groups", "end-first")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport,engine", [("tcp", "python"), ("auto", "native")])  # (shm: the same code)
@pytest.mark.parametrize("case,order", _RUNS, ids=[f"{c}-{o}" for c, o in _RUNS])
def test_every_survivor_of_a_two_hop_chain_names_the_stopped_rank(tmp_path, case, order, transport, engine):
    if engine == "native":
        pytest.importorskip("ndist.collectives.backends.socket.native._cnative")
    res = run_ranks(_two_hops, 4, args=(str(tmp_path), case, ORDERS[order]), init=False, timeout=90,
                    env={"NDIST_TRANSPORT": transport, "NDIST_ENGINE": engine})
    for rank, via in ((C, None), (B, C), (A, B)):
        kind, msg, waited, err_rank = res[rank]
        assert kind == "DistTimeoutError", (CASES[case], rank, res[rank])
        assert not_heard_from(msg) == [S], (CASES[case], rank, res[rank])
        if via is not None:
            assert f"rank {via} (" in msg and "waited on it" in msg, (CASES[case], rank, res[rank])
        assert err_rank in (None, S), res[rank]
        # the group timeout + up to two graces of 0.3 s (the chain's end raises at its
        # grace's end, the others at once after it) + load
        assert 2.4 < waited < TIMEOUT + 0.6 + 2.0, (CASES[case], rank, res[rank])
