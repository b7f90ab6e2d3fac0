"""Collective links open where an algorithm needs them, not as a full mesh: on real
processes, after a barrier and a small all_reduce a rank holds exactly the links to
the peers its schedules name (O(log n)), an all_to_all opens the rest, and a group
on the native engine opens none. Counted through ``Mesh.linked``; the set-up's store
round trips are counted on the real store."""

from __future__ import annotations

import math
from datetime import timedelta

import numpy as np
import pytest

from ndist.testing import run_ranks

pytestmark = pytest.mark.timeout(240)


def _schedule_peers(op: str, n: int, rank: int, nbytes: int, count: int) -> set:
    from ndist.collectives.backends.socket.schedules import _schedule as S

    algo = S.choose(op, nbytes, n, count)
    assert algo is not None, f"{op} at n={n} runs the direct exchange"
    sizes = {"barrier": (), "all_reduce": (count,)}[op]
    sch = S.schedule(op, algo, 4 if op == "all_reduce" else 1, sizes, n, rank)
    return {x.peer for rnd in sch.rounds for x in (*rnd.sends, *rnd.recvs)}


def _links(rank, world_size):
    import ndist.collectives  # noqa: F401  registers the socket backend
    from ndist.runtime import destroy_process_group, init_process_group, resolve_group

    from tests.backend_driver import Driver

    from ndist.runtime.store import _tcp as tcp_store

    init_process_group(backend="socket")
    b = Driver(resolve_group(None).backend_for("cpu"))
    requests = []
    real = tcp_store.TCPStore._request

    def counted(self, *args, **kwargs):  # the real store, its round trips counted
        requests.append(args[1])
        return real(self, *args, **kwargs)
    tcp_store.TCPStore._request = counted
    try:
        early = list(b._mesh.linked)  # before this rank's first collective: only what peers dialled
        b.barrier(blocking=True)
        x = np.full(16, rank + 1.0, dtype=np.float32)
        b.all_reduce(x, blocking=True).wait()
        assert x.tolist() == [world_size * (world_size + 1) / 2] * 16
        small = b._mesh.linked
        trips = len(requests)
        # every rank has read its links before any starts the all_to_all (whose dials would
        # show up here): a rendezvous through the store, which opens no collective link
        store = b._mesh.store
        store.set(f"links-read/{rank}", b"1")
        store.wait([f"links-read/{p}" for p in range(world_size)], timedelta(seconds=60))
        ins = [np.full(3, rank * 100 + p, dtype=np.int64) for p in range(world_size)]
        outs = [np.empty(3, dtype=np.int64) for _ in range(world_size)]
        b.all_to_all(outs, ins, blocking=True).wait()
        assert [o.tolist() for o in outs] == [[p * 100 + rank] * 3 for p in range(world_size)]
        return b.engine, small, b._mesh.linked, trips, early
    finally:
        tcp_store.TCPStore._request = real
        destroy_process_group()


@pytest.mark.parametrize("n", [8, 16])
def test_a_rank_links_only_the_peers_its_schedules_name(n):
    res = run_ranks(_links, n, init=False, env={"NDIST_ENGINE": "python"}, timeout=200)
    for rank, (engine, small, after, trips, early) in enumerate(res):
        assert engine == "python"
        # the group's set-up reads every member's facts in one wait and one multi_get,
        # not a get per member (the check and the wait may each be retried a little)
        assert 2 <= trips <= 8, (rank, trips)
        want = _schedule_peers("barrier", n, rank, 0, 0) | _schedule_peers("all_reduce", n, rank, 64, 16)
        assert set(small) == want, (rank, small, sorted(want))
        assert set(early) <= want, (rank, early, sorted(want))  # a faster peer's barrier may dial it first
        assert len(small) <= 2 * math.ceil(math.log2(n)) < n - 1
        assert after == [p for p in range(n) if p != rank]  # pairwise all_to_all: every peer


def test_a_group_on_the_native_engine_opens_no_collective_link():
    from ndist.collectives.backends.socket.native import _engine as _native

    from types import SimpleNamespace

    if _native.module_for("auto", SimpleNamespace(socket_engine="auto")) is None:  # (whatever NDIST_ENGINE says)
        pytest.skip("the native engine is not built here")
    res = run_ranks(_links, 4, init=False, env={"NDIST_ENGINE": "native"}, timeout=200)
    assert [r[:3] for r in res] == [("native", [], [])] * 4
