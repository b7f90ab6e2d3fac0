"""The staging backend's host buffers: the pool, packing and copies (NumPy as the device)."""

from __future__ import annotations

import numpy as np
import pytest

from ndist.collectives._staging import HostArrays, PinnedPool, _Staging


def test_pool_reuses_released_buffers_by_size_class():
    pool = PinnedPool(HostArrays().alloc_host)
    a = pool.acquire(5000)
    assert a.nbytes == 8192 and a.dtype == np.uint8
    pool.release(a)
    b = pool.acquire(6000)
    assert b is a and pool.allocations == 1
    c = pool.acquire(6000)  # b is in use: a second buffer
    assert c is not b and pool.allocations == 2


def test_pool_minimum_class_and_keep_limit():
    pool = PinnedPool(HostArrays().alloc_host, keep=1)
    small = pool.acquire(0)
    assert small.nbytes == 4096
    x, y = pool.acquire(10), pool.acquire(10)
    pool.release(x)
    pool.release(y)  # over the keep limit: dropped
    assert pool.acquire(10) is x
    assert pool.acquire(10) is not y


def _staging(reads, writes, pool=None):
    return _Staging(HostArrays(), pool or PinnedPool(HostArrays().alloc_host), reads, writes)


def test_twins_match_shape_and_dtype_in_one_packed_aligned_buffer():
    arrays = [np.arange(3, dtype=np.int16), np.ones((2, 5), np.complex128), np.array(True), np.zeros((0, 4))]
    st = _staging(arrays, [])
    base = st.buffer.ctypes.data
    for a in arrays:
        t = st.twin(a)
        assert t.shape == a.shape and t.dtype == a.dtype
        assert not np.shares_memory(t, a)
        if a.nbytes:
            assert (t.ctypes.data - base) % 256 == 0
            assert np.shares_memory(t, st.buffer)


def test_copy_in_reads_and_copy_out_writes_only_what_the_op_touches():
    src = np.arange(6, dtype=np.float32).reshape(2, 3)
    dst = np.zeros(4, np.int64)
    untouched = np.full(3, 9, np.int8)
    st = _staging([src, untouched], [dst])
    st.copy_in()
    np.testing.assert_array_equal(st.twin(src), src)
    st.twin(dst)[...] = [1, 2, 3, 4]
    st.twin(untouched)[...] = 0
    st.copy_out()
    np.testing.assert_array_equal(dst, [1, 2, 3, 4])
    np.testing.assert_array_equal(untouched, [9, 9, 9])


def test_in_place_array_has_one_twin():
    buf = np.arange(4.0)
    st = _staging([buf], [buf])
    st.copy_in()
    st.twin(buf)[...] *= 10
    st.copy_out()
    np.testing.assert_array_equal(buf, [0, 10, 20, 30])


def test_release_returns_the_buffer_once():
    pool = PinnedPool(HostArrays().alloc_host)
    st = _staging([np.ones(10)], [], pool)
    buf = st.buffer
    st.release()
    st.release()
    assert pool.acquire(80) is buf
    assert pool.acquire(80) is not buf


def test_no_arrays_no_buffer():
    st = _staging([], [])
    assert st.buffer is None
    st.copy_in()
    st.copy_out()
    st.release()


@pytest.mark.parametrize("dtype", ["bool", "uint16", "float16", "complex64", "int64"])
def test_round_trip_preserves_bits(dtype):
    rng = np.random.default_rng(1)
    a = rng.integers(0, 2, 17).astype(dtype) if dtype == "bool" else (rng.standard_normal(17) * 100).astype(dtype)
    out = np.zeros_like(a)
    st = _staging([a], [out])
    st.copy_in()
    st.twin(out)[...] = st.twin(a)
    st.copy_out()
    assert out.tobytes() == a.tobytes()
