"""Shared-memory rings of the socket backend: the ring itself (two real mappings of
one /dev/shm file), and collectives over rings: used only between same-host ranks,
off with NDIST_RING=0 or the tcp transport, correct when tiny rings wrap and
fill, and a reader asleep in poll woken by the writer's doorbell."""

import logging
import os
import threading
import time
from collections import deque

import numpy as np
import pytest

from ndist.collectives.backends.socket.engine import _engine
from ndist.collectives.backends.socket.wire import _ring
from ndist.collectives._reduce_op import ReduceOp

from tests.collectives.backends._socket_threads import make_backends, run_group, run_threads
from tests.backend_driver import Driver

pytestmark = pytest.mark.skipif(not _ring.available(), reason="shared-memory rings need x86-64 and /dev/shm")


@pytest.fixture
def ring_pair(tmp_path):
    path = f"/dev/shm/ndist-test-ring-p{os.getpid()}-{time.monotonic_ns()}"
    owner = _ring.RingFile(path, 2, 4096, create=True)
    peer = _ring.RingFile(path, 2, 4096, create=False)
    try:
        yield owner.ring(1), peer.ring(1)
    finally:
        owner.unlink()


def test_ring_carries_bytes_in_order_across_the_wrap_and_stops_when_full(ring_pair):
    w, r = ring_pair
    rng = np.random.default_rng(0)
    sent, got = bytearray(), bytearray()
    buf = memoryview(bytearray(1500))
    for i in range(200):  # ~300 KB through a 4 KiB ring
        chunk = rng.integers(0, 256, int(rng.integers(1, 1400)), dtype=np.uint8).tobytes()
        sent += chunk
        out = deque([memoryview(chunk)])
        while out:  # the writer takes what fits; the reader drains a little each time
            assert not w.write(out)[1]
            k = r.read_into(buf)
            got += buf[:k]
    while (k := r.read_into(buf)):
        got += buf[:k]
    assert bytes(got) == bytes(sent) and len(sent) > 100_000
    # full: a writer takes only what fits, leaves the rest queued
    out = deque([memoryview(bytes(5000))])
    n, _ = w.write(out)
    assert n == 4096 and len(out[0]) == 5000 - 4096
    assert w.write(out) == (0, False)
    assert r.read_into(memoryview(bytearray(100))) == 100
    assert w.write(out)[0] == 100


def test_reader_about_to_sleep_is_told_of_data_and_the_writer_sees_it_asleep(ring_pair):
    w, r = ring_pair
    assert r.read_into(memoryview(bytearray(8))) == 0
    assert r.sleep() is False  # empty: it may block now
    n, asleep = w.write(deque([memoryview(b"abc")]))
    assert n == 3 and asleep  # the writer must ring the doorbell
    r.wake()
    assert w.write(deque([memoryview(b"d")])) == (1, False)
    assert r.sleep() is True  # data is waiting: don't block
    buf = memoryview(bytearray(8))
    assert r.read_into(buf) == 4 and bytes(buf[:4]) == b"abcd"


def test_ring_capacity_from_the_environment(monkeypatch):
    monkeypatch.delenv(_ring.RING_ENV, raising=False)
    monkeypatch.delenv(_ring.OLD_RING_ENV, raising=False)
    assert _ring.capacity_from_env(2) == _ring.capacity_from_env(16) == _ring.DEFAULT_CAPACITY
    assert _ring.capacity_from_env(32) == 128 << 10 and _ring.capacity_from_env(1024) == 64 << 10
    monkeypatch.setenv(_ring.RING_ENV, "0")
    assert _ring.capacity_from_env() == 0
    for bad in ("lots", "100", "-4096"):
        monkeypatch.setenv(_ring.RING_ENV, bad)
        with pytest.raises(ValueError, match="NDIST_RING"):
            _ring.capacity_from_env()


def test_the_old_ring_variable_still_works_and_is_logged_once(monkeypatch, caplog):
    """NDIST_SHM_RING (before "ring" was the rings' one word) is read when NDIST_RING is
    unset, with one deprecation line in the log; NDIST_RING wins over it."""
    monkeypatch.delenv(_ring.RING_ENV, raising=False)
    monkeypatch.setenv("NDIST_SHM_RING", "8192")
    monkeypatch.setattr(_ring, "_told_old", [])
    with caplog.at_level(logging.WARNING, logger="ndist.collectives.socket"):
        assert _ring.capacity_from_env() == 8192
        assert _ring.capacity_from_env() == 8192
    told = [r for r in caplog.records if "NDIST_SHM_RING is deprecated" in r.getMessage()]
    assert len(told) == 1 and "NDIST_RING" in told[0].getMessage()
    monkeypatch.setenv("NDIST_SHM_RING", "lots")
    with pytest.raises(ValueError, match="NDIST_SHM_RING"):  # the error names the variable that was set
        _ring.capacity_from_env()
    monkeypatch.setenv(_ring.RING_ENV, "0")
    assert _ring.capacity_from_env() == 0


@pytest.mark.parametrize("transport, env, used", [("auto", None, True), ("shm", None, True), ("tcp", None, False),
                                                  ("auto", "0", False)])
def test_rings_carry_the_collective_streams_of_same_host_ranks(monkeypatch, transport, env, used):
    if env is None:
        monkeypatch.delenv(_ring.RING_ENV, raising=False)
    else:
        monkeypatch.setenv(_ring.RING_ENV, env)

    def fn(b):
        x = np.full(16, b.rank + 1.0)
        b.all_reduce(x, blocking=True).wait()
        return x.tolist(), [(c.ring_in is not None, c.ring_out is not None) for c in b._eng.conns.values()]
    res = run_group(3, fn, transport, engine="python")  # the Python engine's links
    for x, rings in res:
        assert x == [6.0] * 16
        assert rings == [(used, used)] * 2


def test_tiny_rings_wrap_and_fill_under_every_collective(monkeypatch):
    monkeypatch.setenv(_ring.RING_ENV, "4096")  # frames of up to 32 KiB through 4 KiB rings

    def fn(b):
        rng = np.random.default_rng(7)  # the same draws on every rank
        n, r = b.size, b.rank
        for i in range(60):
            count = int(rng.integers(0, 6000))
            x = np.arange(count, dtype=np.float32) * (r + 1)
            b.all_reduce(x, ReduceOp.SUM, blocking=True).wait()
            assert np.array_equal(x, np.arange(count, dtype=np.float32) * sum(range(1, n + 1)))
            sizes = rng.integers(0, 3000, (n, n))
            ins = [np.full(int(sizes[r, p]), r * 10 + p, np.int16) for p in range(n)]
            outs = [np.empty(int(sizes[p, r]), np.int16) for p in range(n)]
            b.all_to_all(outs, ins, blocking=True).wait()
            assert all((outs[p] == p * 10 + r).all() for p in range(n))
            y = np.full(count, float(i)) if r == i % n else np.zeros(count)
            b.broadcast(y, i % n, blocking=True).wait()
            assert (y == i).all()
        return True
    assert run_group(3, fn, "auto", timeout=60, engine="python") == [True] * 3


def test_a_reader_asleep_in_poll_is_woken_by_the_doorbell(monkeypatch):
    monkeypatch.delenv(_ring.RING_ENV, raising=False)
    rings_rung = []
    real = _engine.CollectiveStreams._doorbell

    def counting(self, conn):
        rings_rung.append((self.rank, conn.peer))
        real(self, conn)
    monkeypatch.setattr(_engine.CollectiveStreams, "_doorbell", counting)
    # the long sleep between tries keeps the reader asleep unless the doorbell wakes it
    monkeypatch.setattr(_ring, "MAX_SLEEP_S", 5.0)
    backends = make_backends(2, "auto", engine="python")  # the Python engine's rings
    try:
        def fn(b):
            x = np.ones(8)
            b.all_reduce(x, blocking=True).wait()  # connections and rings up
            if b.rank == 1:
                time.sleep(0.3)  # rank 0 spins, yields, then blocks in poll
            t0 = time.monotonic()
            b.all_reduce(x, blocking=True).wait()
            return time.monotonic() - t0, x.tolist()
        (w0, x0), (_, x1) = run_threads(backends, fn, timeout=60)
    finally:
        for b in backends:
            b.close()
    assert x0 == x1 == [4.0] * 8
    assert (1, 0) in rings_rung  # rank 1 found rank 0 asleep and rang
    assert 0.25 < w0 < 2.5, w0  # woken at once, not after MAX_SLEEP_S


def _ring_map(b):
    return {p: (c.ring_in is not None, c.ring_out is not None) for p, c in b._eng.conns.items()}


def test_a_pair_uses_rings_only_when_both_ranks_offer_them(monkeypatch):
    from datetime import timedelta
    from types import SimpleNamespace

    from ndist.collectives.backends.socket import SocketBackend
    from ndist.runtime import BackendContext, HashStore

    store, backends = HashStore(), []
    for r in range(3):  # rank 0 turned rings off (its own environment), ranks 1 and 2 did not
        monkeypatch.setenv(_ring.RING_ENV, "0" if r == 0 else "65536")
        ctx = BackendContext(store=store, rank=r, size=3, timeout=timedelta(seconds=30), group_name="ringmix",
                             global_ranks=(0, 1, 2), device="cpu",
                             options=SimpleNamespace(transport="auto", socket_engine="python"))
        backends.append(Driver(SocketBackend(ctx)))
    try:
        def fn(b):
            x = np.full(4, b.rank + 1.0)
            b.all_reduce(x, blocking=True).wait()
            return x.tolist(), _ring_map(b)
        res = run_threads(backends, fn)
    finally:
        for b in backends:
            b.close()
    assert all(x == [6.0] * 4 for x, _ in res)
    assert res[0][1] == {1: (False, False), 2: (False, False)}
    assert res[1][1] == {0: (False, False), 2: (True, True)}
    assert res[2][1] == {0: (False, False), 1: (True, True)}


def test_no_room_for_rings_falls_back_to_the_sockets(monkeypatch, caplog):
    import errno

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.delenv(_ring.RING_ENV, raising=False)
    monkeypatch.setattr(os, "posix_fallocate", full)  # /dev/shm is full

    def fn(b):
        x = np.full(4, b.rank + 1.0)
        b.all_reduce(x, blocking=True).wait()
        return x.tolist(), _ring_map(b)
    with caplog.at_level("WARNING"):
        res = run_group(2, fn, "auto", engine="python")
    assert [x for x, _ in res] == [[3.0] * 4] * 2
    assert res[0][1] == {1: (False, False)} and res[1][1] == {0: (False, False)}
    assert "no shared-memory rings" in caplog.text and "No space left" in caplog.text
    assert not [n for n in os.listdir("/dev/shm") if n.endswith("-ring") and f"-p{os.getpid()}-" in n]


def test_a_doorbell_to_a_peer_that_read_and_left_is_not_a_loss(monkeypatch):
    """CI (the Python-engine step, 2026-11-24): rank 1 wrote its last frame of a barrier into
    rank 0's ring, found rank 0 asleep and rang its doorbell; rank 0 had meanwhile woken on
    its own, read the frame, finished and closed, so the doorbell's write failed (EPIPE) and
    rank 1's barrier raised 'lost connection to rank 0'. A doorbell is a wake-up hint: the
    data is in the ring, and a peer that left without reading it is seen by the reads."""
    monkeypatch.delenv(_ring.RING_ENV, raising=False)
    monkeypatch.setattr(_ring, "MAX_SLEEP_S", 0.02)  # the reader wakes on its own
    closed0, armed, rung = threading.Event(), threading.Event(), []
    real = _engine.CollectiveStreams._doorbell

    def late(self, conn):
        if self.rank == 1 and armed.is_set():
            rung.append(conn.peer)
            closed0.wait(10)  # ring only once rank 0 has read, finished and closed
        real(self, conn)
    monkeypatch.setattr(_engine.CollectiveStreams, "_doorbell", late)
    backends = make_backends(2, "auto", engine="python")
    try:
        def fn(b):
            x = np.ones(8)
            b.all_reduce(x, blocking=True).wait()  # connections and rings up
            if b.rank == 1:
                time.sleep(0.3)  # rank 0 goes to sleep in poll
                armed.set()
            b.all_reduce(x, blocking=True).wait()
            if b.rank == 0:
                b.close()
                closed0.set()
            return x.tolist()
        res = run_threads(backends, fn, timeout=60)
    finally:
        closed0.set()
        for b in backends:
            b.close()
    assert res == [[4.0] * 8] * 2
    assert rung, "rank 1 never found rank 0 asleep (the race was not made)"
