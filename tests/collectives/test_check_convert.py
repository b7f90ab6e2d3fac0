"""The argument checker and the array conversion, in one process (no group needed)."""

from __future__ import annotations

import numpy as np
import pytest

from ndist.collectives import ReduceOp, _make_nccl_premul_sum
from ndist.collectives import _check
from ndist.collectives._convert import as_array, contiguous_input, contiguous_output

from tests.collectives.interop_cases import DLPackOnly


def test_split_sizes_default_and_explicit():
    assert _check.split_sizes("s", None, 6, 3, "input") == [2, 2, 2]
    assert _check.split_sizes("s", [], 6, 3, "input") == [2, 2, 2]
    assert _check.split_sizes("s", (0, 6, np.int64(0)), 6, 3, "input") == [0, 6, 0]
    with pytest.raises(ValueError, match=r"s: sizes \[1, 1, 1\] sum to 3, but dim 0 of input has 6 rows"):
        _check.split_sizes("s", [1, 1, 1], 6, 3, "input")
    with pytest.raises(TypeError, match=r"s: expected a list of ints, got int"):
        _check.split_sizes("s", 3, 6, 3, "input")
    with pytest.raises(TypeError, match=r"s\[1\]: expected an int, got bool"):
        _check.split_sizes("s", [6, True, 0], 6, 3, "input")


def test_split_sizes_of_a_list_or_tuple_of_ints_runs_no_python_code():
    """A list or tuple is asked first by its exact type: no ``typing.Sequence``
    ``isinstance`` (its ABC checks are Python code, the largest cost of an uneven
    ``all_to_all_single`` on the general path); other sequences still pass."""
    import collections
    import sys

    called = []

    def prof(frame, event, arg):
        if event == "call" and frame.f_code.co_name != "split_sizes":
            called.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    sys.setprofile(prof)
    try:
        a = _check.split_sizes("s", [1, 5], 6, 2, "input")
        b = _check.split_sizes("s", (3, 3), 6, 2, "input")
        c = _check.split_sizes("s", [], 6, 2, "input")
    finally:
        sys.setprofile(None)
    assert (a, b, c) == ([1, 5], [3, 3], [3, 3])
    assert called == []
    assert _check.split_sizes("s", collections.deque([2, 4]), 6, 2, "input") == [2, 4]
    assert _check.split_sizes("s", range(0), 6, 2, "input") == [3, 3]
    with pytest.raises(TypeError, match=r"s: expected a list of ints, got str"):
        _check.split_sizes("s", "33", 6, 2, "input")


@pytest.mark.parametrize("dtype,op,ok", [
    ("bool", ReduceOp.SUM, True), ("bool", ReduceOp.BXOR, True), ("bool", ReduceOp.AVG, False),
    ("int8", ReduceOp.BAND, True), ("int8", ReduceOp.AVG, True), ("uint64", ReduceOp.AVG, True),
    ("uint64", ReduceOp.MIN, True),
    ("float16", ReduceOp.MAX, True), ("float16", ReduceOp.BOR, False), ("float64", ReduceOp.AVG, True),
    ("complex64", ReduceOp.PRODUCT, True), ("complex64", ReduceOp.MIN, False), ("complex128", ReduceOp.BXOR, False),
])
def test_reduce_op_table(dtype, op, ok):
    if ok:
        assert _check.reduce_op(op, np.dtype(dtype)) == (op, None)
    else:
        with pytest.raises(ValueError, match=f"op: {op.name}"):
            _check.reduce_op(op, np.dtype(dtype))


def test_premul_sum_factor_forms():
    assert _check.reduce_op(_make_nccl_premul_sum(2), np.float32) == (ReduceOp.PREMUL_SUM, 2)
    assert _check.reduce_op(_make_nccl_premul_sum(np.array([0.25])), np.float32) == (ReduceOp.PREMUL_SUM, 0.25)
    assert _check.reduce_op(_make_nccl_premul_sum(1j), np.complex64) == (ReduceOp.PREMUL_SUM, 1j)
    with pytest.raises(TypeError, match="complex but the tensor's dtype is float32"):
        _check.reduce_op(_make_nccl_premul_sum(1j), np.float32)
    with pytest.raises(TypeError, match="got bool"):
        _check.reduce_op(_make_nccl_premul_sum(True), np.float32)
    bf16 = pytest.importorskip("ml_dtypes").bfloat16
    assert _check.reduce_op(ReduceOp.AVG, np.dtype(bf16)) == (ReduceOp.AVG, None)
    with pytest.raises(ValueError, match="BAND needs an integer or bool tensor, got dtype bfloat16"):
        _check.reduce_op(ReduceOp.BAND, np.dtype(bf16))


def test_dtype_and_device_checks_name_the_argument():
    a, b = np.zeros(2), np.zeros(2, np.int64)
    with pytest.raises(TypeError, match=r"out\[1\]: expected dtype float64 \(the dtype of inp\), got int64"):
        _check.same_dtype([("inp", a), ("out[0]", a), ("out[1]", b)])
    assert _check.same_device([("inp", a), ("out", b)]) == "cpu"


def test_as_array_is_zero_copy():
    base = np.arange(6.0)
    assert as_array(base, "t") is base

    class ArrayInterface:  # anything exposing the array interface
        def __init__(self, arr):
            self.__array_interface__ = arr.__array_interface__

    view = as_array(ArrayInterface(base), "t")
    view[0] = 42
    assert base[0] == 42
    dl = as_array(DLPackOnly(base), "t")
    dl[1] = 7
    assert base[1] == 7
    with pytest.raises(TypeError, match="t: expected a tensor .* got list"):
        as_array([1, 2], "t")
    with pytest.raises(TypeError, match="t: expected a tensor .* got object"):
        as_array(object(), "t")


def test_ndist_tensor_is_its_array():
    tensor_mod = pytest.importorskip("ndist.tensor")
    arr = np.arange(4)
    assert as_array(tensor_mod.Tensor._wrap(arr), "t") is arr


def test_contiguous_staging_writes_back():
    base = np.zeros((4, 2))
    strided = base[:, 0]
    assert contiguous_input(base) is base
    copy = contiguous_input(strided)
    assert copy.flags.c_contiguous and copy is not strided
    post = []
    staged = contiguous_output(strided, post)
    assert staged.flags.c_contiguous and len(post) == 1
    staged[...] = 5
    assert base[0, 0] == 0
    post[0]()
    np.testing.assert_array_equal(base, [[5, 0]] * 4)
    post = []
    assert contiguous_output(base, post) is base and post == []


def test_reduce_op_cache_keeps_each_pair_apart():
    # A (op, dtype) pair that passed is remembered; another op on that dtype, or that op on
    # another dtype, is still checked on its own.
    f32 = np.dtype(np.float32)
    assert _check.reduce_op(ReduceOp.SUM, f32) == (ReduceOp.SUM, None)
    assert _check.reduce_op(ReduceOp.SUM, f32) == (ReduceOp.SUM, None)
    with pytest.raises(ValueError, match="op: BAND needs an integer or bool tensor, got dtype float32"):
        _check.reduce_op(ReduceOp.BAND, f32)
    assert _check.reduce_op(ReduceOp.AVG, f32) == (ReduceOp.AVG, None)
    assert _check.reduce_op(ReduceOp.AVG, np.dtype(np.int32)) == (ReduceOp.AVG, None)
    with pytest.raises(ValueError, match="op: AVG needs an integer, floating-point or complex tensor, got dtype bool"):
        _check.reduce_op(ReduceOp.AVG, np.dtype(np.bool_))
    with pytest.raises(ValueError, match="PREMUL_SUM needs its factor"):
        _check.reduce_op(ReduceOp.PREMUL_SUM, f32)
    with pytest.raises(TypeError, match="op: expected a ndist.distributed.ReduceOp, got str"):
        _check.reduce_op("sum", f32)


def test_common_checks_dtype_then_device_and_names_lazily():
    a, b = np.zeros(2, np.float32), np.zeros(2, np.float32)
    asked = []

    def name_of(i):
        asked.append(i)
        return f"t[{i}]"

    assert _check.common([a, b, a], name_of) == "cpu"
    assert asked == []  # names are built only for an error
    with pytest.raises(TypeError, match=r"t\[2\]: expected dtype float32 \(the dtype of t\[0\]\), got int64"):
        _check.common([a, b, np.zeros(2, np.int64)], name_of)
    with pytest.raises(TypeError, match=r"t\[1\]: expected a tensor"):
        _check.tensor_list([a, [1.0]], "t", 2)


def test_tensor_list_fast_path_keeps_the_checks():
    a = np.zeros(3)
    ro = np.zeros(3)
    ro.flags.writeable = False
    assert _check.tensor_list([a, ro], "inputs", 2)[1] is ro  # inputs may be read-only
    with pytest.raises(ValueError, match=r"outputs\[1\]: expected a writable tensor"):
        _check.tensor_list([a, ro], "outputs", 2, out=True)
    with pytest.raises(TypeError, match="outputs: expected a list of tensors, got str"):
        _check.tensor_list("ab", "outputs", 2, out=True)
    with pytest.raises(ValueError, match="expected a list of 3 tensors"):
        _check.tensor_list((a, a), "outputs", 3, out=True)


def test_unaliased_copies_only_an_input_overlapping_an_output():
    from ndist.collectives._convert import unaliased

    buf = np.arange(8.0)
    other = np.zeros(8)
    (same,) = unaliased([other], [buf])
    assert same is other  # no overlap: no copy
    (copied,) = unaliased([buf[2:6]], [buf])
    assert copied is not buf and not np.shares_memory(copied, buf)
    np.testing.assert_array_equal(copied, [2, 3, 4, 5])
    ins = unaliased([buf[:4], other], [buf[4:], np.zeros(2)])
    assert ins[0].base is buf and ins[1] is other  # disjoint halves of one buffer stay views


# ------------------------------------------------------------ the buffer protocol
def test_buffer_protocol_objects_are_viewed_in_place_with_their_formats_dtype():
    import array
    import ctypes
    import mmap

    ba = bytearray(b"\x01\x02\x03")
    v = as_array(ba, "t")
    assert v.dtype == np.uint8 and v.shape == (3,) and v.flags.writeable
    v[0] = 9
    assert ba[0] == 9  # the caller's memory
    arr = array.array("d", [1.0, 2.0])
    assert as_array(arr, "t").dtype == np.float64
    as_array(arr, "t")[1] = 5.0
    assert arr[1] == 5.0
    m = memoryview(bytearray(24)).cast("i", (2, 3))
    assert as_array(m, "t").shape == (2, 3) and as_array(m, "t").dtype == np.intc
    c = (ctypes.c_int32 * 4)(1, 2, 3, 4)  # ctypes' format '<i'
    as_array(c, "t")[0] = 7
    assert c[0] == 7 and as_array(c, "t").dtype == np.int32
    with mmap.mmap(-1, 8) as mm:
        view = as_array(mm, "t")
        assert view.dtype == np.uint8 and view.size == 8
        del view
    ro = as_array(b"ab", "t")  # bytes: an input only
    assert ro.dtype == np.uint8 and not ro.flags.writeable
    for code in ("b", "B", "h", "H", "i", "I", "l", "L", "q", "Q", "f", "d", "?"):
        assert as_array(memoryview(bytearray(8)).cast(code), "t").dtype == np.dtype(code), code
    half = memoryview(np.zeros(2, np.float16))  # format 'e' (memoryview.cast has no 'e')
    assert half.format == "e" and as_array(half, "t").dtype == np.float16
    for dt in (np.complex64, np.complex128):  # formats 'Zf' / 'Zd' (NumPy's export, read as a memoryview)
        z = memoryview(np.array([1 + 2j], dt))
        assert z.format == {np.complex64: "Zf", np.complex128: "Zd"}[dt]
        assert as_array(z, "t").dtype == dt and as_array(z, "t")[0] == 1 + 2j


def test_a_strided_memoryview_is_a_strided_view_staged_like_an_array():
    base = np.arange(8, dtype=np.float32)
    view = as_array(memoryview(base)[::2], "t")
    assert view.shape == (4,) and not view.flags.c_contiguous and np.shares_memory(view, base)
    post: list = []
    staged = contiguous_output(_check.output(memoryview(base)[::2], "t"), post)
    staged[...] = -1
    post[0]()
    np.testing.assert_array_equal(base, [-1, 1, -1, 3, -1, 5, -1, 7])


def test_buffer_format_errors_name_the_argument_the_formats_and_the_format():
    import array

    with pytest.raises(TypeError, match=r"t: expected a buffer of format b, B, h, H, i, I, l, L, q, Q, e, f, d, \?, "
                                        r"Zf, Zd \(struct's codes, native byte order\), got format 'c' \(memoryview\)"):
        _check.tensor(memoryview(bytearray(2)).cast("c"), "t")
    with pytest.raises(TypeError, match=r"t: expected a buffer of format .* got format '[uw]' \(array\)"):
        _check.tensor(array.array("u", "ab"), "t")  # (wchar_t: 'w' on Python 3.11)
    with pytest.raises(TypeError, match=r"t: expected native byte order \(little-endian\), got format '>i' "
                                        r"\(memoryview, big-endian\)"):
        _check.tensor(memoryview(np.zeros(2, ">i4")), "t")
    with pytest.raises(ValueError, match=r"out: expected a writable tensor, got a read-only bytes of shape \(2,\)"):
        _check.output(b"ab", "out")
    read_only = memoryview(bytearray(4)).toreadonly()
    with pytest.raises(ValueError, match=r"out: expected a writable tensor, got a read-only memoryview of shape \(4,"):
        _check.output(read_only, "out")
    released = memoryview(bytearray(4))
    released.release()
    with pytest.raises(ValueError, match=r"t: expected a readable buffer, got memoryview \(operation forbidden"):
        _check.tensor(released, "t")
    with pytest.raises(TypeError, match=r"t: expected a tensor .*or the buffer protocol\), got object"):
        as_array(object(), "t")


def test_a_buffer_with_suboffsets_is_refused_naming_the_argument():
    """An indirect (PIL-style) buffer: CPython's ``_testbuffer`` exports one (NumPy cannot)."""
    tb = pytest.importorskip("_testbuffer")
    pil = tb.ndarray(list(range(8)), shape=[2, 4], format="f", flags=tb.ND_PIL | tb.ND_WRITABLE)
    assert memoryview(pil).suboffsets == (0, -1)
    with pytest.raises(TypeError, match=r"^out: expected a buffer without suboffsets \(one block of memory, any "
                                        r"strides\), got ndarray with suboffsets \(0, -1\) \(an indirect, "
                                        r"PIL-style buffer: copy it into one block first\)$"):
        _check.output(pil, "out")
    with pytest.raises(TypeError, match=r"^t: expected a buffer without suboffsets .* got memoryview with"):
        as_array(memoryview(pil), "t")


def test_buffer_dtype_takes_the_item_size_of_standard_sizes_and_refuses_a_size_with_no_dtype():
    from ndist.collectives._convert import buffer_dtype

    assert buffer_dtype("=l", 4, "x", "t") == np.int32  # struct's standard size: 4 bytes
    assert buffer_dtype("<L", 8, "x", "t") == np.uint64  # (ctypes' c_ulong on LP64)
    assert buffer_dtype("@f", 4, "x", "t") == np.float32 and buffer_dtype(None, 1, "x", "t") == np.uint8
    with pytest.raises(TypeError, match=r"t: expected items of 4 bytes for format '=f', got 3-byte items \(x\)"):
        buffer_dtype("=f", 3, "x", "t")
    with pytest.raises(TypeError, match=r"t: expected native byte order \(little-endian\), got format '!d'"):
        buffer_dtype("!d", 8, "x", "t")
