"""Socket backend with ranks in separate processes (the tests that count):
every op over both transports, peer death, shared-memory cleanup."""

from __future__ import annotations

import glob
import multiprocessing as mp
import os
import signal
import time
from datetime import timedelta

import numpy as np
import pytest

from ndist.testing import run_ranks

pytestmark = pytest.mark.timeout(180)


def _backend():
    import ndist.collectives  # noqa: F401  registers the socket backend
    from ndist.runtime import init_process_group, resolve_group

    from tests.backend_driver import Driver

    init_process_group(backend="socket")
    return Driver(resolve_group(None).backend_for("cpu"))


def _all_ops(rank, world_size, count):
    from ndist.runtime import destroy_process_group

    from tests.collectives.backends._socket_bodies import all_ops

    b = _backend()
    try:
        return all_ops(b, count) and b._prefix
    finally:
        destroy_process_group()


@pytest.mark.parametrize("transport", ["tcp", "shm"])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_op_across_processes(transport, n):
    prefixes = run_ranks(_all_ops, n, args=(70_000,), transport=transport, init=False, timeout=150)
    # destroy_process_group unlinked every segment
    assert not any(glob.glob(f"/dev/shm/{p}*") for p in prefixes)


def _small_counts(rank, world_size):
    from ndist.runtime import destroy_process_group

    from tests.collectives.backends._socket_bodies import all_ops

    b = _backend()
    try:
        return all_ops(b, 1) and all_ops(b, 0)
    finally:
        destroy_process_group()


def test_zero_and_one_element_messages_across_processes():
    assert run_ranks(_small_counts, 3, init=False, timeout=150) == [True] * 3


# --------------------------------------------------------------- peer death
def _member(rank, size, port, secret, q, transport, die):
    import ndist.collectives  # noqa: F401
    from types import SimpleNamespace

    from ndist.collectives import ReduceOp
    from ndist.collectives.backends.socket import SocketBackend
    from ndist.runtime import BackendContext, DistNetworkError
    from ndist.runtime.store import TCPStore

    store = TCPStore("127.0.0.1", port, timeout=60, secret=secret)
    ctx = BackendContext(store, rank, size, timedelta(seconds=120), "death", tuple(range(size)), "cpu",
                         SimpleNamespace(transport=transport))
    from tests.backend_driver import Driver

    b = Driver(SocketBackend(ctx))
    x = np.ones(100_000)
    b.all_reduce(x, ReduceOp.SUM, blocking=True).wait()
    q.put(("prefix", rank, b._prefix))
    if rank == die:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        b.all_reduce(x, ReduceOp.SUM, blocking=True).wait()
        q.put(("ok", rank, None))
    except DistNetworkError as err:
        q.put(("net", rank, (err.rank, err.host, str(err), time.monotonic() - t0)))
    except BaseException as err:  # noqa: BLE001
        q.put(("other", rank, repr(err)))
    t0 = time.monotonic()
    b.close()
    q.put(("closed", rank, time.monotonic() - t0))


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_killed_peer_fails_survivors_with_its_rank_and_host(transport, monkeypatch):
    from ndist.runtime.store import TCPStoreServer

    secret = os.urandom(16).hex()
    monkeypatch.setenv("NDIST_SECRET", secret)
    server = TCPStoreServer("127.0.0.1", 0, secret)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    n, die = 3, 1
    procs = [ctx.Process(target=_member, args=(r, n, server.port, secret, q, transport, die)) for r in range(n)]
    try:
        for p in procs:
            p.start()
        events = []
        while sum(1 for e in events if e[0] == "closed") < n - 1:
            events.append(q.get(timeout=120))
        prefixes = {r: v for k, r, v in events if k == "prefix"}
        results = {r: (k, v) for k, r, v in events if k in ("ok", "net", "other")}
        closes = [v for k, r, v in events if k == "closed"]
        for r in (0, 2):
            kind, v = results[r]
            assert kind == "net", (r, kind, v)
            peer, host, msg, waited = v
            assert "rank 1" in msg
            assert peer == 1 or "rank 1" in msg
            assert host
            assert waited < 30
        assert all(c < 5 for c in closes)
        # the dead rank's segment was unlinked by a survivor
        if transport == "shm":
            assert not glob.glob(f"/dev/shm/{prefixes[die]}*")
        assert not any(glob.glob(f"/dev/shm/{prefixes[r]}*") for r in (0, 2))
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        server.close()


def _groups_async(rank, world_size):
    from ndist.collectives import ReduceOp
    from ndist.runtime import destroy_process_group, new_group, resolve_group

    from tests.backend_driver import Driver

    world = _backend()
    try:
        g_all = Driver(resolve_group(new_group()).backend_for("cpu"))
        g_odd = resolve_group(new_group([1, 2])) if world_size > 2 else None
        sub = Driver(g_odd.backend_for("cpu")) if g_odd is not None and g_odd.is_member else None
        x = np.full(70_000, rank, np.float64)
        y = np.full(5, rank, np.int64)
        z = np.full(3, rank, np.int32)
        # issue on the two full groups in opposite orders on even and odd ranks
        if rank % 2:
            works = [g_all.all_reduce(y, ReduceOp.SUM), world.all_reduce(x, ReduceOp.SUM)]
        else:
            works = [world.all_reduce(x, ReduceOp.SUM), g_all.all_reduce(y, ReduceOp.SUM)]
        if sub is not None:
            works.append(sub.all_reduce(z, ReduceOp.MAX))
        for w in works:
            w.wait(timeout=60)
        total = world_size * (world_size - 1) // 2
        assert (x == total).all() and (y == total).all()
        if sub is not None:
            assert (z == 2).all()
        return True
    finally:
        destroy_process_group()


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_several_groups_async_in_any_order_across_processes(transport):
    assert run_ranks(_groups_async, 3, transport=transport, init=False, timeout=120) == [True] * 3
