"""The native engine's single-copy all_to_all: blocks of at least ``NDIST_NATIVE_CMA_MIN``
bytes (16 KiB by default) are read straight from the sender's buffer
(``process_vm_readv``) where the kernel lets the receiver read the sender, and copied
through the shared slots otherwise. Results must be the same bytes either way (the
Python engine is the reference), and a rank that may not read a peer falls back."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from ndist.testing import run_ranks
from tests.collectives.backends._socket_bodies import broadcast_to_a_dead_receiver
from tests.kill_sync import run_with_victim

pytest.importorskip("ndist.collectives.backends.socket.native._cnative")

KIB = 1 << 10


def _cma_blocks() -> int:
    import ndist.distributed as dist

    be = dist.group.WORLD.backend_for("cpu")
    return be._native.g.cma_blocks


def _blocks(rank: int, size: int, lens):
    """rank's input blocks: block q has lens[rank][q] float32 values unique to (rank, q, i)."""
    return [np.arange(lens[rank][q], dtype=np.float32) + np.float32(rank * 1000 + q * 100)
            for q in range(size)]


def _exchange(rank, size, lens, rounds=2, drop_ptrace_read=False, not_dumpable=()):
    import ndist.distributed as dist

    if drop_ptrace_read:
        _drop_cap_sys_ptrace()
    if rank in not_dumpable:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: peers may not read us
    dist.init_process_group("socket")
    try:
        dist.barrier()  # the group's set-up (the native engine attaches at the first collective)
        engine = dist.get_engine()
        before = _cma_blocks() if engine == "native" else 0
        for r in range(rounds):
            ins = _blocks(rank, size, lens)
            outs = [np.full(lens[q][rank], -1, np.float32) for q in range(size)]
            dist.all_to_all(outs, ins)
            for q in range(size):
                want = np.arange(lens[q][rank], dtype=np.float32) + np.float32(q * 1000 + rank * 100)
                assert outs[q].tobytes() == want.tobytes(), (r, q)
            # the single-buffer form, uneven splits
            inp = np.concatenate(ins)
            out = np.full(sum(lens[q][rank] for q in range(size)), -1, np.float32)
            dist.all_to_all_single(out, inp, [lens[q][rank] for q in range(size)], list(lens[rank]))
            assert out.tobytes() == np.concatenate(outs).tobytes()
        return engine, (_cma_blocks() if engine == "native" else 0) - before
    finally:
        dist.destroy_process_group()


def _drop_cap_sys_ptrace() -> None:
    """Drop CAP_SYS_PTRACE from this process's effective set (a no-op where it has none), so
    the kernel applies the ordinary ptrace checks to its process_vm_readv."""
    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    libc = ctypes.CDLL(None, use_errno=True)
    hdr, data = Header(0x20080522, 0), (Data * 2)()
    if libc.capget(ctypes.byref(hdr), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    data[0].effective &= ~(1 << 19)  # CAP_SYS_PTRACE
    if libc.capset(ctypes.byref(hdr), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


MIB_BLOCK = 256 * KIB  # float32 values: 1 MiB per block


def test_large_blocks_go_with_one_copy():
    n = 2
    lens = [[MIB_BLOCK] * n for _ in range(n)]
    res = run_ranks(_exchange, n, timeout=120, init=False, args=(lens,), env={"NDIST_ENGINE": "native"})
    # 2 rounds x (list form + single form) x 1 peer block per rank, each read by address
    assert res == [("native", 4)] * n


def test_uneven_splits_across_the_threshold():
    # rank r sends rank q lens[r][q] floats: some blocks below 256 KiB (through the slots,
    # some over several pieces), some above (by address), one empty
    n = 3
    lens = [[0, 64 * KIB + 3, 300 * KIB // 4 * 4],
            [300 * KIB + 1, 17, 64 * KIB - 1],
            [65 * KIB, 400 * KIB + 5, 0]]
    res = run_ranks(_exchange, n, timeout=180, init=False, args=(lens,),
                    env={"NDIST_ENGINE": "native", "NDIST_NATIVE_CMA_MIN": str(256 * KIB)})
    # blocks of >= 256 KiB (65,536 floats): rank 0 gets 300K+1 from 1 and 65K from 2; rank 1 gets
    # 64K+3 from 0 and 400K+5 from 2; rank 2 gets 300K from 0 (1 KiB = 256 floats)
    big = [[lens[q][r] * 4 >= 256 * KIB for q in range(n) if q != r] for r in range(n)]
    assert [r[1] for r in res] == [4 * sum(b) for b in big]
    assert all(r[0] == "native" for r in res)
    # the same exchange on the Python engine (the reference) checks the same bytes
    assert run_ranks(_exchange, n, timeout=180, init=False, args=(lens, 1), env={"NDIST_ENGINE": "python"}) == \
        [("python", 0)] * n


def test_threshold_env_turns_it_off():
    n = 2
    lens = [[MIB_BLOCK] * n for _ in range(n)]
    res = run_ranks(_exchange, n, timeout=120, init=False, args=(lens, 1),
                    env={"NDIST_ENGINE": "native", "NDIST_NATIVE_CMA_MIN": "0"})
    assert res == [("native", 0)] * n


def test_threshold_env_lowers_it():
    n = 2
    lens = [[4 * KIB] * n for _ in range(n)]  # 16 KiB blocks
    res = run_ranks(_exchange, n, timeout=120, init=False, args=(lens, 1),
                    env={"NDIST_ENGINE": "native", "NDIST_NATIVE_CMA_MIN": str(16 * KIB)})
    assert res == [("native", 2)] * n


def test_bad_threshold_env_is_a_value_error(monkeypatch):
    from ndist.collectives.backends.socket.native import _engine as _native

    monkeypatch.setenv("NDIST_NATIVE_CMA_MIN", "lots")
    with pytest.raises(ValueError, match="NDIST_NATIVE_CMA_MIN.*'lots'"):
        _native.cma_min_bytes()
    monkeypatch.setenv("NDIST_NATIVE_CMA_MIN", "-1")
    with pytest.raises(ValueError, match="NDIST_NATIVE_CMA_MIN.*-1"):
        _native.cma_min_bytes()


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux")
def test_a_rank_the_kernel_forbids_to_read_falls_back():
    # rank 1 is not dumpable and no rank holds CAP_SYS_PTRACE: the kernel refuses rank 0's
    # process_vm_readv of rank 1 (EPERM), so rank 1's block to rank 0 goes through the slots;
    # rank 1 may still read rank 0
    n = 2
    lens = [[MIB_BLOCK] * n for _ in range(n)]
    res = run_ranks(_exchange, n, timeout=120, init=False, args=(lens, 2, True, (1,)), env={"NDIST_ENGINE": "native"})
    assert res == [("native", 0), ("native", 4)]


# --- broadcast by address: a root whose receivers can all read it sends its buffer by
# address and waits until each has read it: with one receiver from NDIST_NATIVE_CMA_MIN up to
# one slot, with 2 or more receivers (no more than the cores) from 1 MiB

def _native_group(rank, not_dumpable):
    """Init the world (ranks in ``not_dumpable`` may not be read; then no rank holds
    CAP_SYS_PTRACE, as in the all_to_all case above), run its set-up; the C group."""
    import ndist.distributed as dist

    if not_dumpable:
        _drop_cap_sys_ptrace()
    if rank in not_dumpable:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
    dist.init_process_group("socket")
    dist.barrier()
    return dist.group.WORLD.backend_for("cpu")._native.g


def _broadcasts(rank, size, counts, not_dumpable=()):
    import ndist.distributed as dist

    g = _native_group(rank, not_dumpable)
    try:
        before = g.cma_blocks
        for count in counts:
            for root in range(size):
                want = np.arange(count, dtype=np.float32) * np.float32(root + 1)
                buf = want.copy() if rank == root else np.full(count, -1, np.float32)
                dist.broadcast(buf, src=root)
                if rank == root:
                    buf[:] = -7  # the caller's buffer again at return: no receiver reads this
                else:
                    assert buf.tobytes() == want.tobytes(), (count, root)
        dist.barrier()
        return g.bcast_min, g.cma_blocks - before
    finally:
        dist.destroy_process_group()


def test_a_large_broadcast_to_two_receivers_goes_by_address():
    # from 1 MiB (BCAST_MANY_MIN) by address: 1 MiB and 4 MiB + 4 bytes; 1000 floats and
    # 300 KiB through the slots
    counts = [1000, 300 * KIB // 4, (1 << 20) // 4, (4 << 20) // 4 + 1]
    res = run_ranks(_broadcasts, 3, timeout=120, init=False, args=(counts,), env={"NDIST_ENGINE": "native"})
    if (os.cpu_count() or 1) < 2:
        assert res == [(0, 0)] * 3  # more receivers than cores: the slots
    else:
        # each rank received 2 by-address sizes from each of the 2 other roots
        assert res == [(1 << 20, 4)] * 3


def test_one_receiver_gets_one_slot_by_address_and_more_through_the_slots():
    # at 2 ranks: 256 KiB (one piece) by address; 4 MiB through the slots, whose pieces
    # pipeline on both cores (16 KiB, the default threshold, up to one slot: 256 KiB)
    res = run_ranks(_broadcasts, 2, timeout=120, init=False, args=([(256 << 10) // 4, (4 << 20) // 4],),
                    env={"NDIST_ENGINE": "native"})
    assert res == [(16 * KIB, 1)] * 2  # 1 size x the 1 other root


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores (2 receivers)")
def test_a_broadcast_root_no_receiver_may_read_goes_through_the_slots():
    # rank 1 is not dumpable and no rank holds CAP_SYS_PTRACE: as root, its broadcast goes through the slots; ranks 0 and 2
    # still send by address (rank 1 may read them)
    res = run_ranks(_broadcasts, 3, timeout=120, init=False, args=([(1 << 20) // 4], (1,)),
                    env={"NDIST_ENGINE": "native"})
    # rank 0 reads 2's buffer only, rank 1 reads 0's and 2's, rank 2 reads 0's
    assert [r[1] for r in res] == [1, 2, 1], res


@pytest.mark.timeout(120)
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores (2 receivers)")
def test_a_dead_receiver_of_a_broadcast_by_address_is_named_by_the_root(tmp_path):
    # 4 MiB: by address; the root waits for its receivers: names rank 2 in this call
    res = run_with_victim(broadcast_to_a_dead_receiver, 3, 2, tmp_path, 1 << 20, term_timeout=8, timeout=100,
                          NDIST_ENGINE="native")
    assert res.launcher_exitcode != 0, res
    rec = res[0]
    err = rec["first"]
    assert err and err[0] in ("DistRankFailureError", "DistNetworkError") and err[2] == 2, rec
    assert "rank 2" in err[1] and rec["next_s"] < 2.0, rec


# --- all_gather by address: where the ranks are no more than the cores, a rank whose peers
# can all read it posts its input's address (>= NDIST_NATIVE_CMA_MIN bytes); each peer reads
# it, and the rank returns once they have

def _gathers(rank, size, counts, not_dumpable=()):
    import ndist.distributed as dist

    g = _native_group(rank, not_dumpable)
    try:
        before = g.cma_blocks
        for count in counts:
            def part(q):
                return np.arange(count, dtype=np.float32) * np.float32(q + 1) + np.float32(count)
            inp = part(rank)
            out = np.full(size * count, -1, np.float32)
            dist.all_gather_into_tensor(out, inp)
            inp[:] = -7  # the caller's buffer again at return: no peer reads this
            assert out.tobytes() == np.concatenate([part(q) for q in range(size)]).tobytes(), count
            out = np.full(size * count, -1, np.float32)  # in place: the input is this rank's part of out
            mine = out[rank * count:(rank + 1) * count]
            mine[:] = part(rank)
            dist.all_gather_into_tensor(out, mine)
            assert out.tobytes() == np.concatenate([part(q) for q in range(size)]).tobytes(), count
            outs = [np.full(count, -1, np.float32) for _ in range(size)]
            dist.all_gather(outs, part(rank))
            assert all(outs[q].tobytes() == part(q).tobytes() for q in range(size)), count
        dist.barrier()
        return g.gather_min, g.cma_blocks - before
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores (2 ranks reading at once)")
def test_a_large_all_gather_goes_by_address():
    # 256 KiB and 4 MiB + 4 bytes by address, 1000 floats and 255 KiB + 4 through the slots
    counts = [1000, 255 * KIB // 4 + 1, 256 * KIB // 4, (4 << 20) // 4 + 1]
    res = run_ranks(_gathers, 2, timeout=120, init=False, args=(counts,),
                    env={"NDIST_ENGINE": "native", "NDIST_NATIVE_CMA_MIN": str(256 * KIB)})
    assert res == [(256 * KIB, 2 * 3)] * 2  # 2 sizes x 3 forms, from the 1 peer


def test_an_all_gather_with_more_ranks_than_cores_takes_the_slots():
    n = (os.cpu_count() or 1) + 1
    res = run_ranks(_gathers, n, timeout=180, init=False, args=([(1 << 20) // 4],), env={"NDIST_ENGINE": "native"})
    assert res == [(0, 0)] * n


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores (2 ranks reading at once)")
def test_an_all_gather_part_no_peer_may_read_goes_through_the_slots():
    # rank 1 is not dumpable and no rank holds CAP_SYS_PTRACE: its 4 MiB part goes through
    # the slots (4 pieces), rank 0's by address (1 piece): both count 4 pieces
    res = run_ranks(_gathers, 2, timeout=120, init=False, args=([(4 << 20) // 4], (1,)),
                    env={"NDIST_ENGINE": "native"})
    assert [r[1] for r in res] == [0, 3], res
