import pickle

import numpy as np
import pytest

import ndist

ALL = [ndist.bool, ndist.uint8, ndist.int8, ndist.int16, ndist.int32, ndist.int64,
       ndist.float16, ndist.float32, ndist.float64, ndist.complex64, ndist.complex128]


def test_aliases_are_the_same_objects():
    assert ndist.float is ndist.float32
    assert ndist.double is ndist.float64
    assert ndist.half is ndist.float16
    assert ndist.long is ndist.int64
    assert ndist.int is ndist.int32
    assert ndist.short is ndist.int16
    assert ndist.cfloat is ndist.complex64
    assert ndist.cdouble is ndist.complex128


def test_properties_and_repr():
    assert ndist.float32.is_floating_point and not ndist.float32.is_complex
    assert ndist.complex64.is_complex and not ndist.complex64.is_floating_point
    assert not ndist.int64.is_floating_point
    assert ndist.int16.itemsize == 2 and ndist.complex128.itemsize == 16
    assert repr(ndist.int32) == "ndist.int32" and str(ndist.cfloat) == "ndist.complex64"
    assert ndist.uint8.is_signed is False and ndist.int8.is_signed is True


def test_bfloat16_from_ml_dtypes():
    pytest.importorskip("ml_dtypes")
    t = ndist.tensor([1.5, 2.25], dtype=ndist.bfloat16)
    assert t.dtype is ndist.bfloat16 and t.element_size() == 2
    assert t.tolist() == [1.5, 2.25]
    assert ndist.promote_types(ndist.float16, ndist.bfloat16) is ndist.float32


@pytest.mark.parametrize("d", ALL)
def test_dtype_pickles_to_the_singleton(d):
    assert pickle.loads(pickle.dumps(d)) is d


def test_default_dtype_roundtrip():
    assert ndist.get_default_dtype() is ndist.float32
    try:
        ndist.set_default_dtype(ndist.float64)
        assert ndist.tensor([1.5]).dtype is ndist.float64
        assert (ndist.tensor([1]) + 0.5).dtype is ndist.float64
        assert ndist.tensor([1j]).dtype is ndist.complex128
        assert ndist.zeros(2).dtype is ndist.float64
    finally:
        ndist.set_default_dtype(ndist.float32)
    assert ndist.tensor([1.5]).dtype is ndist.float32


def test_set_default_dtype_rejects_non_float():
    with pytest.raises(TypeError, match="floating point.*int64"):
        ndist.set_default_dtype(ndist.int64)


def test_to_dtype_rejects_garbage():
    with pytest.raises(TypeError, match="dtype"):
        ndist.zeros(2, dtype="nonsense")
    with pytest.raises(TypeError, match="unsupported element type"):
        ndist.from_numpy(np.array(["a"]))


# torch.promote_types, checked against torch 2.13
PROMOTE = [
    (ndist.uint8, ndist.int8, ndist.int16),
    (ndist.bool, ndist.int8, ndist.int8),
    (ndist.bool, ndist.float16, ndist.float16),
    (ndist.int64, ndist.float16, ndist.float16),
    (ndist.int32, ndist.int64, ndist.int64),
    (ndist.float16, ndist.float32, ndist.float32),
    (ndist.complex64, ndist.float64, ndist.complex128),
    (ndist.complex64, ndist.float16, ndist.complex64),
    (ndist.complex128, ndist.int8, ndist.complex128),
    (ndist.uint8, ndist.int64, ndist.int64),
]


@pytest.mark.parametrize("a,b,want", PROMOTE)
def test_promote_types(a, b, want):
    assert ndist.promote_types(a, b) is want
    assert ndist.promote_types(b, a) is want


# (expression, expected dtype) -- torch 2.13's answers
RESULT = [
    (lambda: ndist.tensor([1, 2]) + 1.5, ndist.float32),
    (lambda: ndist.tensor([1, 2]) + True, ndist.int64),
    (lambda: ndist.tensor([True]) + 1, ndist.int64),
    (lambda: ndist.tensor([True]) + 1.5, ndist.float32),
    (lambda: ndist.tensor([1], dtype=ndist.int8) + 1000, ndist.int8),
    (lambda: ndist.tensor([1], dtype=ndist.float16) + 1.5, ndist.float16),
    (lambda: ndist.tensor([1], dtype=ndist.cfloat) + 1.5, ndist.complex64),
    (lambda: ndist.tensor([1.]) + 1j, ndist.complex64),
    (lambda: ndist.tensor([1.], dtype=ndist.float64) + 1j, ndist.complex128),
    (lambda: ndist.tensor([1], dtype=ndist.int32) + 1j, ndist.complex64),
    (lambda: ndist.tensor([1], dtype=ndist.int32) + ndist.tensor(1.5, dtype=ndist.float64), ndist.float64),
    (lambda: ndist.tensor([1.], dtype=ndist.float16) + ndist.tensor(1.5, dtype=ndist.float64), ndist.float16),
    (lambda: ndist.tensor([1], dtype=ndist.int32) + ndist.tensor(1), ndist.int32),
    (lambda: ndist.tensor(1, dtype=ndist.int32) + ndist.tensor(1), ndist.int64),
    (lambda: ndist.tensor([1], dtype=ndist.int16) + ndist.tensor(5.5), ndist.float32),
    (lambda: ndist.tensor([3]) / ndist.tensor([2]), ndist.float32),
    (lambda: ndist.tensor([3], dtype=ndist.float64) / 2, ndist.float64),
    (lambda: ndist.tensor([1, 2]) < 1.5, ndist.bool),
]


@pytest.mark.parametrize("expr,want", RESULT)
def test_result_dtype_like_torch(expr, want):
    assert expr().dtype is want


def test_int8_scalar_wraps_like_torch():
    assert (ndist.tensor([1], dtype=ndist.int8) + 1000).tolist() == [-23]


def test_result_type_function():
    assert ndist.result_type(ndist.tensor([1], dtype=ndist.int32), 1.0) is ndist.float32
    assert ndist.result_type(ndist.tensor(1, dtype=ndist.int32),
                             ndist.tensor([1], dtype=ndist.uint8)) is ndist.uint8


def test_can_cast():
    assert not ndist.can_cast(ndist.float32, ndist.int32)
    assert ndist.can_cast(ndist.int32, ndist.float32)
    assert not ndist.can_cast(ndist.complex64, ndist.float64)
    assert not ndist.can_cast(ndist.int8, ndist.bool)
    assert ndist.can_cast(ndist.bool, ndist.uint8)


def test_finfo_iinfo():
    assert ndist.finfo(ndist.float32).eps == pytest.approx(1.1920928955078125e-07)
    assert ndist.finfo(ndist.float16).max == 65504.0
    assert ndist.finfo().bits == 32
    assert ndist.finfo(ndist.complex128).bits == 64
    assert ndist.iinfo(ndist.int8).min == -128
    assert ndist.iinfo(ndist.int32).max == 2**31 - 1
    with pytest.raises(TypeError, match="floating point"):
        ndist.finfo(ndist.int32)
    with pytest.raises(TypeError, match="integer"):
        ndist.iinfo(ndist.float32)


def test_unsigned_wide_types_and_unknown_arrays():
    t = ndist.from_numpy(np.array([1, 2], dtype=np.uint32))
    assert t.dtype is ndist.uint32 and not ndist.uint32.is_signed
    assert repr(t) == "tensor([1, 2], dtype=ndist.uint32)"
    assert (t + t).dtype is ndist.uint32
    assert ndist.iinfo(ndist.uint16).max == 65535
    weird = ndist.Tensor._wrap(np.array(["x"]))
    with pytest.raises(TypeError, match="Tensor.dtype: unsupported element type"):
        weird.dtype
