"""The native engine's single-copy all_to_all: blocks of at least ``NDIST_NATIVE_CMA_MIN``
bytes (256 KiB by default) are read straight from the sender's buffer
(``process_vm_readv``) where the kernel lets the receiver read the sender, and copied
through the shared slots otherwise. Results must be the same bytes either way (the
Python engine is the reference), and a rank that may not read a peer falls back."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from ndist.testing import run_ranks

pytest.importorskip("ndist.collectives.backends.socket._cnative")

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
    res = run_ranks(_exchange, n, timeout=180, init=False, args=(lens,), env={"NDIST_ENGINE": "native"})
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
    from ndist.collectives.backends.socket import _native

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
