"""The native engine over TCP (``_cnative.TcpGroup``, ctcp.c): which groups run on it, and
its failure paths that the shared suites do not reach. Ranks are threads of this process
over real sockets (``NDIST_TRANSPORT=tcp``: one host's groups on the TCP streams, as across
hosts). The conformance suite runs it as the backend entry ``socket-native-tcp``."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from ndist.runtime import DistError, DistMismatchError, DistNetworkError, DistTimeoutError

from tests.collectives.backends._socket_threads import check_a_loss_told_to_one_rank_wakes_every_waiter, make_backends, run_threads, wait_in_all_reduce

pytest.importorskip("ndist.collectives.backends.socket.native._cnative")
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def native_tcp(monkeypatch):
    monkeypatch.setenv("NDIST_NATIVE_TCP", "1")


@pytest.fixture(params=["tcp", "by-address"])
def links(request, monkeypatch):
    """The group's transport: TCP streams, or (``by-address``) the Unix sockets of one host
    taken for separate hosts (``NDIST_NATIVE_HOSTS=1``), every payload going by address
    (``NDIST_NATIVE_CMA_MIN=1``: ctcp.c's single copy, answered by DONE frames)."""
    if request.param == "tcp":
        return "tcp"
    monkeypatch.setenv("NDIST_NATIVE_HOSTS", "1")
    monkeypatch.setenv("NDIST_NATIVE_CMA_MIN", "1")
    return "auto"


def _by_address(backends, links):
    """Whether the group's payloads went by address as ``links`` says (reads counted)."""
    reads = [b.backend._native.g.cma_blocks for b in backends]
    return all(reads) if links == "auto" else not any(reads)


def _group(n, timeout=30.0, transport="tcp"):
    backends = make_backends(n, transport, timeout=timeout)
    run_threads(backends, lambda b: b.barrier(blocking=True).wait(timeout=30))  # the group up
    return backends


def _close(backends):
    for b in backends:
        b.close()


def _kind(b) -> str:
    nat = b.backend._native
    return type(nat.g).__name__ if nat is not None else "python"


def test_a_group_over_tcp_runs_the_native_tcp_engine_only_when_offered(native_tcp, monkeypatch):
    backends = _group(3)
    try:
        assert [b.engine for b in backends] == ["native"] * 3
        assert [_kind(b) for b in backends] == ["TcpGroup"] * 3
        out = run_threads(backends, lambda b: _all_reduce(b, np.arange(5.0) + b.backend.rank))
        assert all(np.array_equal(o, 3 * np.arange(5.0) + 3) for o in out)
    finally:
        _close(backends)
    for setting in ("0", "auto"):  # (auto: only a group that spans hosts)
        monkeypatch.setenv("NDIST_NATIVE_TCP", setting)
        backends = _group(2)
        try:
            assert [_kind(b) for b in backends] == ["python"] * 2, setting
        finally:
            _close(backends)


def test_a_rank_that_does_not_offer_it_keeps_the_whole_group_on_the_python_engine(native_tcp, monkeypatch):
    # each rank decides from what every rank published: one rank without the offer is enough
    from ndist.collectives.backends.socket.native import _engine as native

    real = native.tcp_offer
    offered = iter([True, False])
    monkeypatch.setattr(native, "tcp_offer", lambda options=None: real(options) if next(offered) else "")
    backends = _group(2)
    try:
        assert [_kind(b) for b in backends] == ["python", "python"]
    finally:
        _close(backends)


def test_a_bad_native_tcp_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv("NDIST_NATIVE_TCP", "yes")
    with pytest.raises(ValueError, match="NDIST_NATIVE_TCP: expected 'auto', '0' or '1', got 'yes'"):
        make_backends(2, "tcp")


def _all_reduce(b, x):
    b.all_reduce(x, blocking=True).wait(timeout=30)
    return x


def test_uneven_all_reduce_parts_and_large_messages_are_exact(native_tcp):
    # 3 ranks: the two-phase all_reduce (above 256 KiB) cuts 100,003 elements unevenly; every
    # rank's result is bit-identical to the rank-order fold
    backends = _group(3)
    try:
        rng = np.random.default_rng(7)
        data = [rng.standard_normal(100_003).astype(np.float32) * 1e3 for _ in range(3)]
        expect = (data[0] + data[1]) + data[2]
        out = run_threads(backends, lambda b: _all_reduce(b, data[b.backend.rank].copy()))
        for o in out:
            assert o.tobytes() == expect.tobytes()
        # the one-phase all_reduce and a reduce to rank 1 (ranks 0 and 1 fold into their own
        # buffer, rank 2 into the scratch): the same fold
        small = [d[:1001] for d in data]
        out = run_threads(backends, lambda b: _all_reduce(b, small[b.backend.rank].copy()))
        for o in out:
            assert o.tobytes() == ((small[0] + small[1]) + small[2]).tobytes()
        out = run_threads(backends, lambda b: _reduce(b, data[b.backend.rank].copy(), 1))
        assert out[1].tobytes() == expect.tobytes()
    finally:
        _close(backends)


def test_a_reduce_scratch_above_64_mib_is_given_back_once_ops_stop_using_it(native_tcp):
    # the root of a reduce receives every peer's buffer into scratch ((n - 1) x its size): kept
    # up to 64 MiB, and above while ops use it; freed after 8 completed ops in a row that
    # needed at most a quarter of it
    backends = _group(2)

    def scratch():
        return [b.backend._native.g.scratch_bytes for b in backends]

    def small():
        run_threads(backends, lambda b: _all_reduce(b, np.ones(1024, np.float32)))

    def big(mib):
        count = (mib << 20) // 8
        out = run_threads(backends, lambda b: _reduce(b, np.full(count, b.backend.rank + 1.0), 0))
        assert np.all(out[0] == 3.0)

    try:
        small()
        assert scratch() == [4097, 4097]  # (n - 1) x 4 KiB, kept
        for _ in range(3):  # a loop of large reduces keeps its scratch between calls
            big(65)
            small()
            assert scratch() == [(65 << 20) + 1, 4097]  # rank 1 received nothing into scratch
        for _ in range(6):  # then 8 ops in a row that need little (the small one above is the 1st)
            small()
        assert scratch() == [(65 << 20) + 1, 4097]
        run_threads(backends, lambda b: b.barrier(blocking=True).wait(timeout=30))  # (needs none)
        assert scratch() == [0, 4097]  # given back
        small()
        assert scratch() == [4097, 4097]
        big(32)  # 32 MiB: at most 64 MiB is kept however it is used
        for _ in range(8):
            small()
        assert scratch() == [(32 << 20) + 1, 4097]
    finally:
        _close(backends)


def _reduce(b, x, root):
    b.reduce(x, root, blocking=True).wait(timeout=60)
    return x


def test_a_mismatch_of_one_phase_exchanges_keeps_the_group(native_tcp, links):
    """All_reduce of 8 against 16 float64 (one phase: each rank sends every other its whole
    buffer and reads one frame from each): both raise naming the other's call, and every
    stream is then at the next op's first frame, so the group goes on, as on one host and
    on the Python engine (docs/errors.md, "A bad argument on one rank only"). Before, the
    mismatch broke the group: the next all_reduce raised it again."""
    backends = _group(2, transport=links)
    try:
        got = {}

        def call(b):
            r = b.backend.rank
            try:
                _all_reduce(b, np.ones(8 if r == 0 else 16))
                got[r] = None
            except DistMismatchError as err:
                got[r] = str(err)

        run_threads(backends, call)
        assert got[0] and got[1], got
        assert "all_reduce" in got[0] and "float64[16]" in got[0], got[0]
        assert "all_reduce" in got[1] and "float64[8]" in got[1], got[1]
        out = run_threads(backends, lambda b: _all_reduce(b, np.full(8, b.backend.rank + 1.0)))
        assert all(np.all(x == 3.0) for x in out), out
        assert not any(b.backend._native.g.broken for b in backends)
        assert _by_address(backends, links)
    finally:
        _close(backends)


def _mismatch_then_next(backends, calls):
    """Each rank runs ``calls[rank]``; then an all_reduce of ones on every rank. Per rank:
    (the first call's error, the next call's error or result)."""
    def run(b):
        r = b.backend.rank
        first = nxt = None
        try:
            calls[r](b)
        except DistError as err:
            first = err
        try:
            nxt = _all_reduce(b, np.ones(4)).tolist()
        except DistError as err:
            nxt = err
        return first, nxt

    return run_threads(backends, run)


def test_a_different_op_on_the_other_rank_is_a_mismatch_on_both(native_tcp, links):
    """Rank 1 calls broadcast (it only receives): it finds rank 0's all_reduce frame, and its
    FAIL frame tells rank 0, which waits for rank 1's all_reduce frame. A broadcast receiver
    sends rank 0 nothing, so rank 0's frame to it would be left unread: the group breaks,
    and the next collective raises the first failure again."""
    backends = _group(2, transport=links)
    try:
        got = _mismatch_then_next(backends, [lambda b: _all_reduce(b, np.ones(4)),
                                             lambda b: b.broadcast(np.ones(4), 0, blocking=True).wait(timeout=30)])
        assert isinstance(got[0][0], DistMismatchError) and "broadcast" in str(got[0][0]), got
        assert isinstance(got[1][0], DistMismatchError) and "all_reduce" in str(got[1][0]), got
        for first, nxt in got:
            assert nxt is first, got
    finally:
        _close(backends)


def test_a_mismatch_of_phases_breaks_the_group(native_tcp, links):
    """What keeps no stream in step breaks the group (every later op raises the first
    failure): a large all_reduce (two phases: reduce-scatter, all-gather) against a small
    one (one phase). Before the mismatch kept a group, the same."""
    backends = _group(2, transport=links)
    try:
        big, small = np.ones(1 << 18, np.float32), np.ones(4, np.float32)  # 1 MiB: reduce-scatter + all-gather
        got = _mismatch_then_next(backends, [lambda b: _all_reduce(b, big), lambda b: _all_reduce(b, small)])
        for first, nxt in got:
            assert isinstance(first, DistMismatchError) and nxt is first, got
    finally:
        _close(backends)


def test_one_peers_size_in_an_all_to_all_keeps_the_group(native_tcp, links):
    """An all_to_all whose block from rank 1 to rank 0 has another size than rank 0 expects
    (the same call otherwise: only rank 0 sees it). Rank 0 drains the frame and raises; rank
    1 read what it expected and returns; every stream is at the next op's first frame, so
    the next all_reduce completes on both, as on the Python engine and on one host
    (test_one_sided_errors.py). Before, rank 0's FAIL frame broke the group and rank 1's
    next op raised it."""
    backends = _group(2, transport=links)
    try:
        def a2a(b):
            r = b.backend.rank
            outs = [np.zeros(3, np.float32), np.zeros(2 if r == 0 else 3, np.float32)]  # (outs[q]: from q)
            ins = [np.ones(3, np.float32), np.ones(3, np.float32)]
            b.all_to_all(outs, ins, blocking=True).wait(timeout=30)

        got = _mismatch_then_next(backends, [a2a, a2a])
        assert isinstance(got[0][0], DistMismatchError) and "expects 8 bytes from rank 1" in str(got[0][0]), got
        assert got[1][0] is None, got
        assert got[0][1] == got[1][1] == [2.0] * 4, got
        assert not any(b.backend._native.g.broken for b in backends)
        assert _by_address(backends, links)
    finally:
        _close(backends)


def test_a_rank_that_never_calls_is_named_in_the_timeout(native_tcp, links):
    backends = _group(2, timeout=1.0, transport=links)
    try:
        t0 = time.monotonic()
        with pytest.raises(DistTimeoutError, match=r"all_reduce.*timed out; ranks not heard from: \[1\]"):
            _all_reduce(backends[0], np.ones(4))
        assert time.monotonic() - t0 < 1.0 + 5
    finally:
        _close(backends)


def test_a_loss_told_to_one_rank_wakes_waiters_on_every_rank_naming_the_lost_rank(native_tcp, links):
    # over TCP, rank 2's FAIL frame wakes ranks 0 and 1, which have rank 2's data already and
    # wait on rank 3
    backends = _group(4, timeout=60.0, transport=links)
    try:
        check_a_loss_told_to_one_rank_wakes_every_waiter(backends)
    finally:
        _close(backends)


def _rank_0_waiting_while(backends, act):
    """What rank 0 got (``wait_in_all_reduce``) from an all_reduce that rank 1 never joins,
    ``act()`` done 0.3 s into its wait."""
    got, (t,) = wait_in_all_reduce(backends, (0,))
    time.sleep(0.3)
    act()
    t.join(30)
    return got[0]


def test_a_rank_that_closes_fails_a_peer_waiting_on_it_naming_it(native_tcp, links):
    backends = _group(2, timeout=60.0, transport=links)
    try:
        _kind, rank, msg, _waited = got = _rank_0_waiting_while(backends, backends[1].close)
        assert rank == 1 and "closed the group" in msg, got
    finally:
        _close(backends)


def test_a_peer_whose_stream_ends_is_named(native_tcp, links):
    # rank 1's side of its link ends without its close notice (as when its host goes away)
    import socket

    def end_rank_1s_stream():
        fd = backends[1].backend._native.g.fds()[0]
        sock = socket.socket(fileno=fd)  # (a socket object over the group's descriptor, to shut it down)
        sock.shutdown(socket.SHUT_RDWR)
        sock.detach()

    backends = _group(2, timeout=60.0, transport=links)
    try:
        _kind, rank, msg, _waited = got = _rank_0_waiting_while(backends, end_rank_1s_stream)
        assert rank == 1 and "lost connection to rank 1" in msg and "all_reduce" in msg, got
    finally:
        _close(backends)


def test_the_mesh_lost_notice_of_a_rank_not_yet_set_up_names_the_lost_rank(native_tcp):
    # 4 ranks; ranks 0 and 1 begin their first collective (every link opened, then the set-up
    # barrier), rank 2 learns, before its own first collective, that rank 3 is lost: its mesh
    # writes the lost notice (the Python engine's ABORT frame) on the links it holds but has
    # not taken. Ranks 0 and 1 read it in C and name rank 3, not rank 2 (kill trial seed
    # 210028: the notice read as a broken stream named the live rank that sent it)
    backends = make_backends(4, "tcp", timeout=60.0)
    try:
        got = {}

        def first_collective(r):
            try:
                backends[r].barrier(blocking=True).wait(timeout=60)
                got[r] = "ok"
            except DistNetworkError as err:
                got[r] = (err.rank, str(err))

        threads = [threading.Thread(target=first_collective, args=(r,), daemon=True) for r in (0, 1)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sorted(backends[2].backend._mesh.linked) != [0, 1]:
            time.sleep(0.01)  # ranks 0 and 1 dialled rank 2 (its acceptor took both links)
        backends[2].backend.failure.record(3, "h3", "lost point-to-point connection to rank 3 (h3): reset")
        for t in threads:
            t.join(30)
        for r in (0, 1):
            rank, msg = got[r]
            assert rank == 3 and "rank 3 (h3) is lost" in msg and "rank 2" in msg, got[r]
            assert "set-up" in msg, got[r]
            # recorded as the group's loss, as one found in an op (the group is then revoked and
            # raises DistRankFailureError: kill trial seed 210056, a plain DistNetworkError)
            assert 3 in backends[r].backend.failure.lost, r
    finally:
        _close(backends)


def test_a_lost_notice_frame_is_raised_with_its_reason():
    # the C engine alone, over a real socket pair: the other end sends the mesh's lost notice
    import socket

    from ndist.collectives.backends.socket.native import _engine as native
    from ndist.collectives.backends.socket.wire import _frame as F

    mod = native.extension()
    a, b = socket.socketpair()
    g = native.attach_tcp(mod, {1: a}, 0, 2, 10.0)
    body = F.pack_abort("lost", 'rank 5 died: "reset"', 5, "h5")
    b.sendall(F.pack(F.ABORT, 0, 0, 0, 0, 7, 0, 0, -1, 0, len(body)) + body)
    b.shutdown(socket.SHUT_WR)
    with pytest.raises(mod.Error) as ei:
        g.all_reduce(np.ones(4), F.dtype_code(np.dtype(np.float64)), 1, 8, None, False)  # (SUM)
    kind, peer, _cause, detail = ei.value.args
    assert (kind, peer) == ("abort", 1) and F.unpack_abort(detail[0])["rank"] == 5, ei.value.args
    nat = native.NativeAlgorithms(mod, g, 0, 2, "g")
    exc = nat.error(ei.value, "g", "rank 0: all_reduce", {1: "h1"}, 10.0)
    assert isinstance(exc, DistNetworkError) and exc.rank == 5 and exc.host == "h5", exc
    assert str(exc).startswith("group 'g': rank 5 (h5) is lost, during rank 0: all_reduce; rank 1 (h1) reported"), exc
    b.close()


def test_a_frame_cut_short_by_a_timeout_is_not_followed_by_a_fail_frame():
    # rank 0 broadcasts 64 MiB to a peer that reads slowly (64 KiB every 20 ms): its deadline
    # passes mid-frame, while the peer still makes room. What the peer's stream then holds
    # must be a prefix of the frame and nothing else: a FAIL header written after it would be
    # read as the payload's next bytes
    import socket

    from ndist.collectives.backends.socket.native import _engine as native
    from ndist.collectives.backends.socket.wire import _frame as F

    mod = native.extension()
    a, b = socket.socketpair()
    g = native.attach_tcp(mod, {1: a}, 0, 2, 0.5)
    buf = np.full(64 << 20, 0xAB, np.uint8)
    got = bytearray()

    def slow_reader():
        b.settimeout(10)
        while True:
            chunk = b.recv(64 << 10)
            if not chunk:
                return
            got.extend(chunk)
            time.sleep(0.02)

    reader = threading.Thread(target=slow_reader, daemon=True)
    reader.start()
    with pytest.raises(mod.Error) as ei:
        g.broadcast(buf, F.dtype_code(buf.dtype), 0)
    assert ei.value.args[:2] == ("timeout", 1), ei.value.args
    reader.join(60)
    assert not reader.is_alive()
    assert 64 < len(got) < 64 + buf.nbytes, len(got)
    assert got[64:] == b"\xab" * (len(got) - 64), "bytes that are not the frame's followed its cut-short payload"
    b.close()


def test_a_failed_op_returns_once_a_peer_read_what_it_sent_by_address(native_tcp, monkeypatch):
    """Rank 0's broadcast sends its buffer by address; its group fails (a loss learnt
    elsewhere) before rank 1, late, reads it. Rank 0 raises only once rank 1 answered DONE
    (at most 1 s), so its caller's next write to the buffer cannot reach rank 1, whose
    broadcast completes with the root's data (the FAIL frame behind the header is for its
    next op). Before, rank 0 raised at once and rank 1 read what the caller wrote after."""
    monkeypatch.setenv("NDIST_NATIVE_HOSTS", "1")
    monkeypatch.setenv("NDIST_NATIVE_CMA_MIN", "1")
    backends = _group(2, timeout=60.0, transport="auto")
    data = np.arange(1 << 16, dtype=np.float64)

    def call(b):
        r = b.backend.rank
        buf = data.copy() if r == 0 else np.zeros_like(data)
        if r == 0:
            threading.Timer(0.1, b.backend._native.g.fail, (1,)).start()
        else:
            time.sleep(0.5)
        try:
            b.broadcast(buf, 0, blocking=True).wait(timeout=30)
        except DistError as err:
            buf[:] = -1  # the caller reuses its buffer once the call raised
            return err
        return buf

    try:
        got = run_threads(backends, call)
        assert isinstance(got[0], DistError), got[0]
        assert isinstance(got[1], np.ndarray) and np.array_equal(got[1], data), got[1]
    finally:
        _close(backends)


def _by_address_frame(F, addr: int, nbytes: int, seq: int = 0) -> bytes:
    """A broadcast's DATA header from root 1 (ctcp.c's ``thdr_t``) whose payload is ``nbytes``
    at ``addr`` in the sender's memory."""
    import struct

    return struct.pack("<IiiiiIQQQQQ", 0x4E445400 | 1, 3, F.dtype_code(np.dtype(np.float64)), 0, 1, 0, addr, seq,
                       nbytes, 0, nbytes)


def test_a_payload_by_address_is_read_and_answered_and_a_dead_senders_is_a_lost_link():
    # the C engine alone, over a real socket pair, its peer's pid given as the link's facts:
    # a header carrying an address in a live process (this one) is read from there and
    # answered with a DONE frame; one whose sender has died is a lost link naming it
    import os
    import socket
    import struct
    import subprocess
    import sys

    from ndist.collectives.backends.socket.native import _engine as native
    from ndist.collectives.backends.socket.wire import _frame as F

    mod = native.extension()
    src = np.arange(4, dtype=np.float64) + 0.5
    for pid, live in ((os.getpid(), True), (None, False)):
        if pid is None:  # a process that has exited (and been reaped)
            child = subprocess.Popen([sys.executable, "-c", "pass"])
            child.wait()
            pid = child.pid
        a, b = socket.socketpair()
        g = mod.TcpGroup(0, 2, [-1, a.detach()], 10.0, 0.0, [None, (pid, False)])
        b.sendall(_by_address_frame(F, src.ctypes.data, src.nbytes))
        buf = np.zeros(4)
        if live:
            g.broadcast(buf, F.dtype_code(np.dtype(np.float64)), 1)
            assert np.array_equal(buf, src) and g.cma_blocks == 1
            done = b.recv(64)
            assert len(done) == 64 and struct.unpack_from("<I", done)[0] == 0x4E445400 | 5  # DONE
        else:
            with pytest.raises(mod.Error) as ei:
                g.broadcast(buf, F.dtype_code(np.dtype(np.float64)), 1)
            assert ei.value.args[:2] == ("lost", 1) and g.cma_blocks == 0, ei.value.args
        b.close()
        del g
