"""Socket backend wire level: frame header checks, authentication, transport choice."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from ndist.collectives import ReduceOp
from ndist.collectives.backends.socket.wire import _frame as F
from ndist.runtime import _net, _shmfiles

from tests.collectives.backends._socket_threads import make_backends, run_group, run_threads

pytestmark = pytest.mark.timeout(60)


def _hdr(**kw):
    base = dict(kind=F.DATA, op=F.op_code("all_reduce"), dtype=F.dtype_code(np.float32), step=0, flags=0, group=1,
                shm_gen=0, seq=1, root=-1, count=4, nbytes=16, offset=0)
    base.update(kw)
    return F.pack(**base)


def test_header_roundtrip():
    h = F.unpack(_hdr(seq=17, nbytes=123, root=3))
    assert (h.seq, h.nbytes, h.root, h.kind) == (17, 123, 3, F.DATA)
    assert F.describe(1, h.op, h.dtype, 4, 17) == "rank 1: all_reduce float32[4] #17"


@pytest.mark.parametrize("field, value, match", [
    ("kind", 9, "kind"),
    ("op", 200, "op code"),
    ("dtype", 250, "dtype"),
    ("flags", 0x80, "flags"),
    ("nbytes", F.MAX_NBYTES + 1, "limit"),
    ("offset", F.MAX_NBYTES + 1, "limit"),
])
def test_header_fields_are_bounds_checked(field, value, match):
    with pytest.raises(F.FrameError, match=match):
        F.unpack(_hdr(**{field: value}))


def test_bad_magic_and_huge_abort_rejected():
    raw = bytearray(_hdr())
    raw[0] ^= 0xFF
    with pytest.raises(F.FrameError, match="magic"):
        F.unpack(bytes(raw))
    with pytest.raises(F.FrameError, match="abort"):
        F.unpack(_hdr(kind=F.ABORT, op=0, nbytes=F.MAX_ABORT + 1))


def test_dtype_codes_are_names_not_numbers():
    assert F.dtype_name(F.dtype_code(np.dtype("float16"))) == "float16"
    assert F.dtype_name(F.dtype_code(np.dtype([("a", "i4")]))) == "other"


def test_wrong_secret_cannot_join_the_mesh():
    backends = make_backends(2)
    try:
        info = backends[0]._mesh.info
        sock = socket.create_connection(("127.0.0.1", info["port"]), timeout=5)
        with pytest.raises(_net.AuthenticationError):
            _net.client_handshake(sock, b"not the job secret", timeout=5)
        sock.close()
        # the group is unaffected
        run_threads(backends, lambda b: b.all_reduce(np.ones(3), ReduceOp.SUM, blocking=True).wait())
    finally:
        for b in backends:
            b.close()


@pytest.mark.parametrize("transport, uses_shm", [("tcp", False), ("shm", True)])
def test_transport_choice(transport, uses_shm):
    def fn(b):
        x = np.ones(1000, np.float32)
        b.all_reduce(x, ReduceOp.SUM, blocking=True).wait()
        assert (x == 2).all()
        return bool(_shmfiles.held(f"{b._prefix}-g"))  # (shared with no name in /dev/shm)
    # the Python engine's segments (-g*); the native engine's file is checked in test_native_*
    assert run_group(2, fn, transport, engine="python") == [uses_shm, uses_shm]


def test_transport_env_is_read(monkeypatch):
    monkeypatch.setenv("NDIST_TRANSPORT", "tcp")
    backends = make_backends(2, transport=None)
    try:
        assert all(b._mode == "tcp" for b in backends)
    finally:
        for b in backends:
            b.close()
    monkeypatch.setenv("NDIST_TRANSPORT", "carrier-pigeon")
    with pytest.raises(ValueError, match="NDIST_TRANSPORT"):
        make_backends(1, transport=None)


@pytest.mark.parametrize("engine", ["python", "native"])
def test_pending_description_on_user_wait_timeout(engine):
    if engine == "native":
        pytest.importorskip("ndist.collectives.backends.socket.native._cnative")
    backends = make_backends(2, timeout=30, engine=engine)
    try:
        run_threads(backends, lambda b: b.barrier(blocking=True).wait())
        w = backends[0].all_reduce(np.ones(3), ReduceOp.SUM)
        from ndist.runtime import DistTimeoutError

        with pytest.raises(DistTimeoutError, match=r"all_reduce \(#2\).*ranks not heard from: \[1\]"):
            w.wait(timeout=0.5)
        backends[1].all_reduce(np.ones(3), ReduceOp.SUM).wait(timeout=30)
        w.wait(timeout=30)
    finally:
        for b in backends:
            b.close()


@pytest.mark.parametrize("transport, family", [("tcp", socket.AF_INET), ("shm", socket.AF_UNIX),
                                                ("auto", socket.AF_UNIX)])
def test_same_host_stream_family(transport, family):
    def fn(b):
        b.barrier(blocking=True).wait()
        return {c.sock.family for c in b._eng.conns.values()}
    assert run_group(3, fn, transport, engine="python") == [{family}] * 3  # the Python engine's links


def test_new_backend_sweeps_segments_of_dead_processes_of_its_job(monkeypatch):
    import multiprocessing as mp
    import os

    from ndist.collectives.backends.socket.wire._segment import job_prefix

    monkeypatch.setenv("NDIST_SECRET", "sweep-test-" + os.urandom(4).hex())
    p = mp.get_context("spawn").Process(target=int)
    p.start()
    p.join()
    job = job_prefix(os.environ["NDIST_SECRET"].encode())
    dead = f"/dev/shm/{job}-0badc0de-r0-p{p.pid}-i0-g1"
    alive = f"/dev/shm/{job}-0badc0de-r1-p{os.getpid()}-i999-g1"
    other = f"/dev/shm/ndist-0000000000-0badc0de-r0-p{p.pid}-i0-g1"
    for path in (dead, alive, other):
        open(path, "wb").close()
    try:
        backends = make_backends(1, transport="shm")
        for b in backends:
            b.close()
        assert not os.path.exists(dead)
        assert os.path.exists(alive) and os.path.exists(other)  # live owner / other job: untouched
    finally:
        for path in (dead, alive, other):
            if os.path.exists(path):
                os.unlink(path)


def test_memory_reference_frames_are_checked():
    addr = 0x7F12_3456_7000  # an address: above MAX_NBYTES, allowed only as a CMA reference
    h = F.unpack(_hdr(flags=F.F_CMA, offset=addr))
    assert (h.flags, h.offset) == (F.F_CMA, addr)
    with pytest.raises(F.FrameError, match="limit"):
        F.unpack(_hdr(flags=F.F_SHM, offset=addr))
    with pytest.raises(F.FrameError, match="flags"):
        F.unpack(_hdr(flags=F.F_SHM | F.F_CMA))
    with pytest.raises(F.FrameError, match="flags"):
        F.unpack(_hdr(kind=F.ACK, flags=F.F_CMA))


def test_cma_probe_reads_only_a_matching_token():
    import os

    from ndist.collectives.backends.socket.wire import _cma

    if not _cma.available():
        pytest.skip("process_vm_readv is not available here")
    info = _cma.probe_info()
    assert _cma.can_read(os.getpid(), info)
    assert not _cma.can_read(os.getpid(), [info[0], "00" * 16])  # the bytes there differ
    assert not _cma.can_read(os.getpid(), None)
    src = np.arange(3 << 20, dtype=np.uint8)
    dst = np.empty_like(src)
    _cma.read_into(os.getpid(), int(src.ctypes.data), dst)
    assert np.array_equal(src, dst)
    with pytest.raises(OSError):
        _cma.read_into(os.getpid(), 8, dst[:16])  # unmapped page


@pytest.mark.parametrize("cores, waits", [(64, True), (1, False)])
def test_spin_only_when_every_rank_has_a_core_and_yield_always(monkeypatch, cores, waits):
    """Ranks <= cores: spin, then sched_yield, then poll; oversubscribed: no spin (it
    would take the core the peer it waits for needs), but sched_yield, which hands the
    core to that peer (4 ranks on 2 cores: 4 KiB all_reduce 280-340 -> 140-230 us)."""
    import os

    from ndist.collectives.backends.socket.engine import _engine

    monkeypatch.setattr(os, "cpu_count", lambda: cores)

    def fn(b):
        b.barrier(blocking=True).wait()
        return (b._eng.spin_s, b._eng.yield_s)
    got = run_group(2, fn, "tcp")
    want = (_engine.SPIN_S, _engine.YIELD_S) if waits else (0.0, _engine.YIELD_S)
    assert got == [want, want] and _engine.YIELD_S > _engine.SPIN_S > 0
