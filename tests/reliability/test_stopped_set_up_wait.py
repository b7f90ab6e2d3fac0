"""A group's set-up waits in the store for a member stuck elsewhere with a stopped rank:
B (rank 1) waits on the stopped rank S (rank 2) in group [1, 2] before it ever uses group
[0, 1], so it never publishes its address there; A (rank 0) uses [0, 1] for the first time
(a collective, or a send) and waits for that address (kill trial seed 2029: A's timeout
named B, "never published its address", which no notice reached). The wait now takes
the root cause from a timeout notice B's process told A's point-to-point side, giving one
a grace when A's deadline passes first (``_stalls.explain_wait``). And the reverse (seed
7312): A waits in a receive on B, which waits in a set-up for S's address: B tells a
first notice as soon as its wait times out, not only after its grace."""

import time
from datetime import timedelta

import pytest

from ndist.testing import run_ranks
from tests.stopped_ranks import finish, not_heard_from, open_streams, stop_one

A, B, S = 0, 1, 2
TIMEOUT = 3.0


def _set_up_wait(rank, size, folder, how, delays):
    import numpy as np

    import ndist.distributed as dist

    dist.init_process_group("socket", timeout=timedelta(seconds=TIMEOUT))
    bs = dist.new_group([B, S])
    x = np.full(8, rank + 1.0)
    dist.all_reduce(x)
    if rank in (B, S) and how != "recv-behind":  # (recv-behind: S never publishes in [1, 2])
        dist.all_reduce(x, group=bs)
    open_streams(dist, rank, ((A, B), (B, A)))  # point-to-point streams up
    pids = stop_one(dist, rank, size, S)  # (a survivor continues S once all have raised)
    if rank == S:
        return ("stopped", None, None, None)
    ab = dist.new_group([A, B])  # (its address is published at its first use)
    time.sleep(delays[rank])
    t0 = time.monotonic()
    outcome = ("ok", None, None, None)
    try:
        if rank == B:
            dist.all_reduce(x, group=bs)  # waits on S (recv-behind: for its address)
        elif how == "recv-behind":
            dist.recv(np.zeros(8), src=B)  # waits on B, which waits in a set-up for S's address
        elif how == "collective":
            dist.all_reduce(x, group=ab)  # the group's set-up waits for B's address
        else:
            dist.send(x, dst=B, group=ab)  # the dial waits for B's address
    except dist.DistError as err:
        outcome = (type(err).__name__, str(err), time.monotonic() - t0, getattr(err, "rank", None))
    finish(folder, rank, (A, B), A, pids[S])
    return outcome


# start delays of A and B: waiter-first, A's store wait times out 0.1 s before B's
# deadline (A waits a grace for B's notice); waited-first, B's notice is there already
ORDERS = {"waiter-first": (0.0, 0.1, 0.0), "waited-first": (0.2, 0.0, 0.0)}
_RUNS = [("collective", "waiter-first"), ("send", "waited-first"), ("recv-behind", "waiter-first")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport,engine", [("tcp", "python"), ("auto", "native")])
@pytest.mark.parametrize("how,order", _RUNS, ids=[f"{h}-{o}" for h, o in _RUNS])
def test_a_set_up_waiting_for_a_stuck_members_address_names_the_stopped_rank(tmp_path, how, order, transport,
                                                                              engine):
    if engine == "native":
        pytest.importorskip("ndist.collectives.backends.socket.native._cnative")
    res = run_ranks(_set_up_wait, 3, args=(str(tmp_path), how, ORDERS[order]), init=False, timeout=90,
                    env={"NDIST_TRANSPORT": transport, "NDIST_ENGINE": engine})
    kind, msg, waited, _ = res[B]
    assert kind == "DistTimeoutError" and not_heard_from(msg) == [S], res[B]
    kind, msg, waited, _ = res[A]
    assert kind == "DistTimeoutError", res[A]
    if how == "recv-behind":  # B's set-up tells its first notice at its deadline (seed 7312: at its end)
        assert not_heard_from(msg) == [S] and f"rank {B} (" in msg, res[A]
    else:
        assert "never published" in msg, res[A]
        assert not_heard_from(msg) == [S] and f"rank {B} waited on it" in msg, res[A]
    assert 2.4 < waited < TIMEOUT + 0.3 + 2.0, res[A]
