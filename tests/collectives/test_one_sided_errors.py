"""A bad argument on one rank only (issue #14, "also seen"): the rank that raised sent
nothing and used no sequence number, so its next collective pairs with the call its
peers are still waiting in. The same call, retried with good arguments, completes it;
another op raises ``DistMismatchError`` on every rank naming both calls, and the group
goes on (docs/errors.md, "A bad argument on one rank only"). The socket backend's
engines both, on one host and over TCP (the native engine's ``TcpGroup``, as across hosts);
MPI has no such check (its ranks would wait in different calls)."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest

from ndist.testing import run_ranks

pytestmark = pytest.mark.timeout(120)

#: the engine, and the environment that picks it (``-tcp``: over TCP, as across hosts)
ENGINES = {"native": {"NDIST_ENGINE": "native"}, "python": {"NDIST_ENGINE": "python"},
           "native-tcp": {"NDIST_ENGINE": "native", "NDIST_TRANSPORT": "tcp", "NDIST_NATIVE_TCP": "1"},
           "python-tcp": {"NDIST_ENGINE": "python", "NDIST_TRANSPORT": "tcp"}}


def _then_in_step(rank, size, case, *args):
    """``case(dist, rank, inp, got, *args)`` in a socket group (20 s), which returns its output
    buffer; then an all_reduce, which shows the group goes on. ``got``: what the case saw
    (``error``), its output (``out``) and the all_reduce's (``after``)."""
    import ndist.distributed as dist

    dist.init_process_group("socket", timeout=timedelta(seconds=20))
    try:
        inp = np.arange(4, dtype=np.float32) + 10 * rank
        got = {}
        out = case(dist, rank, inp, got, *args)
        got["out"] = out.tolist()
        x = np.full(3, rank + 1.0, np.float32)
        dist.all_reduce(x)  # the group goes on, in step
        got["after"] = x.tolist()
        return got
    finally:
        dist.destroy_process_group()


def _one_sided(dist, rank, inp, got, retry):
    out = np.full(4, -1, np.float32)
    if rank == 0:
        with pytest.raises(ValueError, match="output_split_sizes"):
            dist.all_to_all_single(out, inp, [1, 1], [3, 3])  # rows: 2 and 6, not 4
        try:
            if retry:
                dist.all_to_all_single(out, inp, [2, 2], [2, 2])
            else:
                dist.barrier()
        except dist.DistMismatchError as err:
            got["error"] = str(err)
    else:
        try:
            dist.all_to_all_single(out, inp, [2, 2], [2, 2])
        except dist.DistMismatchError as err:
            got["error"] = str(err)
    return out


@pytest.mark.parametrize("engine", list(ENGINES))
def test_the_same_call_retried_completes_the_peers_call(engine):
    if engine.startswith("native"):
        pytest.importorskip("ndist.collectives.backends.socket.native._cnative")
    r0, r1 = run_ranks(_then_in_step, 2, args=(_one_sided, True), init=False, timeout=90, env=ENGINES[engine])
    assert r0 == {"out": [0.0, 1.0, 10.0, 11.0], "after": [3.0] * 3}
    assert r1 == {"out": [2.0, 3.0, 12.0, 13.0], "after": [3.0] * 3}


@pytest.mark.parametrize("engine", list(ENGINES))
def test_another_op_next_is_a_mismatch_on_both_and_the_group_goes_on(engine):
    """(native-tcp: before, the mismatch broke the group; the all_reduce after it raised it again)"""
    if engine.startswith("native"):
        pytest.importorskip("ndist.collectives.backends.socket.native._cnative")
    r0, r1 = run_ranks(_then_in_step, 2, args=(_one_sided, False), init=False, timeout=90, env=ENGINES[engine])
    for got in (r0, r1):
        assert "rank 0: barrier" in got["error"] and "rank 1: all_to_all float32[4] #1" in got["error"], got
        assert got["after"] == [3.0] * 3


def _sizes_disagree(dist, rank, inp, got):
    # each rank's splits are valid on their own; rank 1 expects 3 elements from rank 0,
    # which sends it 2 (rank 0's block for rank 1 is inp[2:4])
    out = np.full(4 if rank == 0 else 5, -1, np.float32)
    try:
        dist.all_to_all_single(out, inp, [2, 2] if rank == 0 else [3, 2], [2, 2])
    except dist.DistMismatchError as err:
        got["error"] = str(err)
    return out


@pytest.mark.parametrize("engine", list(ENGINES))
def test_split_sizes_that_disagree_between_ranks_fail_the_rank_that_sees_it_and_the_group_goes_on(engine):
    """Rank 1 expects 3 elements from rank 0, which sends 2 (each rank's splits are valid).
    Rank 1 reads rank 0's block, sees the size, and raises naming both calls; rank 0 read
    what it expected and returns with its output right; the next all_reduce completes on
    both (every stream was left at the next op's first frame). Every engine alike
    (native-tcp: before, rank 1's FAIL broke the group, and rank 0's next op raised it)."""
    if engine.startswith("native"):
        pytest.importorskip("ndist.collectives.backends.socket.native._cnative")
    r0, r1 = run_ranks(_then_in_step, 2, args=(_sizes_disagree,), init=False, timeout=90, env=ENGINES[engine])
    assert r0 == {"out": [0.0, 1.0, 10.0, 11.0], "after": [3.0] * 3}, r0
    assert "rank 1: all_to_all float32[4] #1 expects 12 bytes from rank 0" in r1["error"], r1
    assert "rank 0: all_to_all float32[4] #1 sends 8 bytes" in r1["error"], r1
    assert r1["after"] == [3.0] * 3, r1
