import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ndist

REAL = [ndist.bool, ndist.uint8, ndist.int8, ndist.int16, ndist.int32, ndist.int64,
        ndist.float16, ndist.float32, ndist.float64, ndist.complex64, ndist.complex128]


def _sample(dt, shape, seed):
    rng = np.random.default_rng(seed)
    if dt is ndist.bool:
        return rng.integers(0, 2, shape).astype(bool)
    if dt.is_complex:
        return (rng.integers(-5, 6, shape) + 1j * rng.integers(-5, 6, shape)).astype(dt.numpy_dtype)
    return rng.integers(1 if dt is ndist.uint8 else -5, 6, shape).astype(dt.numpy_dtype)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(REAL), st.sampled_from(REAL), st.integers(0, 2**31))
def test_add_mul_promote_and_match_numpy(da, db, seed):
    a, b = _sample(da, (3, 1), seed), _sample(db, (4,), seed + 1)
    ta, tb = ndist.from_numpy(a), ndist.from_numpy(b)
    rt = ndist.promote_types(da, db)
    for op in (np.add, np.multiply):
        got = ta + tb if op is np.add else ta * tb
        assert got.dtype is rt
        assert got.shape == (3, 4)
        want = op(a.astype(rt.numpy_dtype), b.astype(rt.numpy_dtype))
        np.testing.assert_array_equal(got.numpy(), want)


def test_broadcasting_and_reflected_ops():
    a = ndist.arange(3).reshape(3, 1)
    b = ndist.arange(4)
    assert (a + b).shape == (3, 4)
    assert (1 - b).tolist() == [1, 0, -1, -2]
    assert (2 ** ndist.tensor([2, 3])).tolist() == [4, 8]
    assert (10 / ndist.tensor([4])).tolist() == [2.5]
    assert (np.ones(2) + ndist.tensor([1.0, 2.0])).__class__ is ndist.Tensor
    with pytest.raises(ValueError, match=r"add: shapes \[2\] and \[3\] are not broadcastable"):
        ndist.tensor([1, 2]) + ndist.tensor([1, 2, 3])


def test_division_family_like_torch():
    assert (ndist.tensor([3]) / ndist.tensor([2])).tolist() == [1.5]
    assert (ndist.tensor([-7, 7]) // 2).tolist() == [-4, 3]
    assert (ndist.tensor([-7, 7]) % 3).tolist() == [2, 1]
    assert (ndist.tensor([-7.5, 7.5]) // 2).tolist() == [-4.0, 3.0]
    assert (ndist.tensor([-7.5, 7.5]) % 2).tolist() == [0.5, 1.5]
    assert ndist.tensor([-7, 7]).div(2, rounding_mode="trunc").tolist() == [-3, 3]
    assert ndist.tensor([-7, 7]).div(2, rounding_mode="trunc").dtype is ndist.int64
    assert ndist.tensor([-7, 7]).div(2, rounding_mode="floor").tolist() == [-4, 3]
    assert ndist.tensor([-7.0, 7.0]).fmod(2).tolist() == [-1.0, 1.0]
    with pytest.raises(ValueError, match="rounding_mode"):
        ndist.tensor([1]).div(2, rounding_mode="up")
    with pytest.raises(ZeroDivisionError, match="integer division by zero"):
        ndist.tensor([1, 2]) // 0
    with pytest.raises(ZeroDivisionError):
        ndist.tensor([1, 2]) % ndist.tensor([1, 0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch does not warn about inf / nan results
        out = ndist.tensor([0.0, 2.0]) / 0
    assert np.isnan(out[0].item()) and out[1].item() == float("inf")


def test_pow_neg_abs_matmul():
    assert (ndist.tensor([2, 3]) ** 2).tolist() == [4, 9]
    assert (ndist.tensor([4, 9]) ** 0.5).dtype is ndist.float32
    assert (-ndist.tensor([1.0, -2.0])).tolist() == [-1.0, 2.0]
    assert abs(ndist.tensor([-1, 2])).tolist() == [1, 2]
    m = ndist.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert (m @ ndist.tensor([1.0, 1.0])).tolist() == [3.0, 7.0]
    assert ndist.matmul(m, m).tolist() == [[7.0, 10.0], [15.0, 22.0]]
    with pytest.raises(ValueError, match=r"matmul: shapes \[2\] and \[3\]"):
        ndist.tensor([1, 2]) @ ndist.tensor([1, 2, 3])
    with pytest.raises(ValueError, match="at least 1 dimension"):
        ndist.tensor(1.0) @ ndist.tensor([1.0])
    with pytest.raises(TypeError, match="bool tensor is not supported"):
        -ndist.tensor([True])


def test_bitwise_ops():
    assert (ndist.tensor([5, 6]) & 3).tolist() == [1, 2]
    assert (ndist.tensor([5, 6]) | 1).tolist() == [5, 7]
    assert (ndist.tensor([5, 6]) ^ 1).tolist() == [4, 7]
    assert (~ndist.tensor([1, 2])).tolist() == [-2, -3]
    assert (~ndist.tensor([True, False])).tolist() == [False, True]
    assert (ndist.tensor([True, False]) | ndist.tensor([False, False])).tolist() == [True, False]
    assert (ndist.tensor([1]) << 3).tolist() == [8]
    with pytest.raises(TypeError, match="bitwise.*float32"):
        ndist.tensor([1.5]) & 1
    with pytest.raises(TypeError, match="~ needs an integer or bool"):
        ~ndist.tensor([1.5])


def test_comparisons_give_bool():
    a = ndist.tensor([1, 2, 3])
    assert (a == ndist.tensor([1, 0, 3])).tolist() == [True, False, True]
    assert (a != 2).tolist() == [True, False, True]
    assert (a < 2.5).tolist() == [True, True, False]
    assert (a >= 2).dtype is ndist.bool
    assert a.equal(ndist.tensor([1, 2, 3])) and not a.equal(ndist.tensor([1, 2]))
    assert ndist.tensor([1.0, 2.0]).allclose(ndist.tensor([1.0, 2.000001]))
    assert hash(a) == id(a)  # tensors stay usable as dict keys


def test_inplace_ops_keep_identity_and_dtype():
    a = ndist.zeros(3, dtype=ndist.int64)
    same = a
    a += 2
    a *= ndist.tensor([1, 2, 3])
    a -= 1
    assert a is same and a.tolist() == [1, 3, 5] and a.dtype is ndist.int64
    f = ndist.ones(2)
    f += ndist.tensor([1, 2])  # int into float32: allowed
    f /= 2
    assert f.tolist() == [1.0, 1.5] and f.dtype is ndist.float32
    with pytest.raises(TypeError, match=r"result type ndist.float32 can't be cast to the desired output type ndist.int64"):
        a += 1.5
    with pytest.raises(TypeError, match="can't be cast"):
        a /= 2
    with pytest.raises(ValueError, match="output shape"):
        b = ndist.zeros(2)
        b += ndist.zeros(3, 2)
    v = ndist.arange(6).reshape(2, 3)
    v[0].add_(10)
    v[1].mul_(2)
    assert v.tolist() == [[10, 11, 12], [6, 8, 10]]
    assert ndist.tensor([1.0, 5.0]).clamp_(2, 4).tolist() == [2.0, 4.0]


def test_reductions():
    x = ndist.arange(6).reshape(2, 3)
    assert x.sum().item() == 15 and x.sum().dim() == 0
    assert x.sum(0).tolist() == [3, 5, 7]
    assert x.sum(dim=1, keepdim=True).shape == (2, 1)
    assert x.sum((0, 1)).item() == 15
    assert x.float().mean(1).tolist() == [1.0, 4.0]
    assert ndist.arange(1, 6).prod().item() == 120
    assert ndist.tensor([True, True]).sum().item() == 2
    assert ndist.tensor([1, 2], dtype=ndist.int8).sum().dtype is ndist.int64
    assert x.sum(dtype=ndist.float64).dtype is ndist.float64
    with pytest.raises(TypeError, match="mean.*Got: ndist.int64"):
        x.mean()
    with pytest.raises(ValueError, match=r"range of \[-2, 1\], but got 2"):
        x.sum(2)


def test_max_min_with_dim_return_namedtuple():
    x = ndist.tensor([[1, 5], [7, 2]])
    r = x.max(1)
    assert r.values.tolist() == [5, 7] and r.indices.tolist() == [1, 0]
    values, indices = x.min(dim=0, keepdim=True)
    assert values.tolist() == [[1, 2]] and indices.tolist() == [[0, 1]]
    assert indices.dtype is ndist.int64
    assert type(r).__name__ == "max" and repr(r).startswith("ndist.return_types.max(\nvalues=")
    assert x.max().item() == 7 and x.min().item() == 1
    assert x.max(ndist.tensor([[3, 3], [3, 3]])).tolist() == [[3, 5], [7, 3]]
    assert x.argmax().item() == 2 and x.argmax(1).tolist() == [1, 0]
    assert x.amax(0).tolist() == [7, 5]
    assert ndist.tensor(5).max(0).values.item() == 5
    with pytest.raises(ValueError, match="non-empty"):
        ndist.empty(0).max()


def test_misc_math():
    assert ndist.tensor([1, 4]).sqrt().tolist() == [1.0, 2.0]
    assert ndist.tensor([1, 2]).exp().dtype is ndist.float32
    assert ndist.tensor([0.5, 1.5, 2.5]).round().tolist() == [0.0, 2.0, 2.0]
    assert ndist.tensor([3.0, 4.0]).norm().item() == 5.0
    assert ndist.tensor([1.0, 2.0, 3.0, 4.0]).var(0).item() == pytest.approx(5 / 3)
    assert ndist.tensor([1, 2, 3]).cumsum(0).tolist() == [1, 3, 6]
    assert ndist.tensor([1, 0]).any().item() and not ndist.tensor([1, 0]).all().item()
    assert ndist.where(ndist.tensor([True, False]), ndist.tensor([1, 2]), 0.5).tolist() == [1.0, 0.5]
    assert ndist.tensor([1, 5]).clamp(min=2).tolist() == [2, 5]
    with pytest.raises(ValueError, match="at least one of"):
        ndist.tensor([1]).clamp()


def test_function_forms():
    x = ndist.arange(6).reshape(2, 3)
    assert ndist.sum(x, dim=0).tolist() == [3, 5, 7]
    assert ndist.add(1, ndist.tensor([1])).tolist() == [2]
    assert ndist.max(x, 1).indices.tolist() == [2, 2]
    with pytest.raises(TypeError, match="argument 'input' must be an ndist.Tensor, not list"):
        ndist.sum([1, 2])


def test_scalar_conversions():
    assert float(ndist.tensor([2.5])) == 2.5
    assert int(ndist.tensor(3)) == 3
    assert [10, 20, 30][ndist.tensor(1)] == 20
    assert bool(ndist.tensor([0])) is False
    with pytest.raises(ValueError, match="more than one value is ambiguous"):
        bool(ndist.tensor([1, 2]))
    with pytest.raises(ValueError, match="2 elements cannot be converted to Scalar"):
        ndist.tensor([1, 2]).item()
    with pytest.raises(TypeError, match="integer tensors"):
        [1][ndist.tensor(0.0)]


def test_casts():
    t = ndist.tensor([1.7, -1.7])
    assert t.int().tolist() == [1, -1] and t.int().dtype is ndist.int32
    assert t.long().dtype is ndist.int64 and t.double().dtype is ndist.float64
    assert t.half().dtype is ndist.float16 and t.bool().tolist() == [True, True]
    assert t.to(ndist.float32) is t  # no-op returns self, like torch
    assert t.to(ndist.float32, copy=True) is not t
    assert t.to(dtype=ndist.int64).tolist() == [1, -1]
    assert t.to(ndist.tensor([1], dtype=ndist.float64)).dtype is ndist.float64
    assert t.to("cpu") is t and t.cpu() is t
    with pytest.raises(TypeError, match="unexpected keyword"):
        t.to(dtype=ndist.int32, colour="red")


def test_half_precision_sums_accumulate_in_float32():
    t = ndist.full((4096,), 1.0, dtype=ndist.float16)
    s = t.sum()
    assert s.dtype is ndist.float16 and s.item() == 4096.0  # a float16 accumulator stops at 2048
    assert t.mean().item() == 1.0 and t.mean().dtype is ndist.float16
    assert t.sum(dtype=ndist.float64).dtype is ndist.float64


def test_every_function_form_has_its_method():
    from ndist.tensor import _functional

    for name in _functional.__all__:
        assert callable(getattr(ndist, name)), name
        assert callable(getattr(ndist.Tensor, name)), name
    x = ndist.tensor([[1.0, -2.0], [3.0, 4.0]])
    assert ndist.abs(x).equal(x.abs()) and ndist.transpose(x, 0, 1).equal(x.T)
    assert ndist.allclose(ndist.exp(ndist.log(ndist.abs(x))), ndist.abs(x))
    assert ndist.flip(x, 0).tolist() == [[3.0, 4.0], [1.0, -2.0]]


def test_value_errors_keep_their_own_message():
    with pytest.raises(ValueError, match="power: Integers to negative integer powers are not allowed"):
        ndist.tensor([2]) ** -1
    t = ndist.tensor([2])
    with pytest.raises(ValueError, match="power_: Integers to negative integer powers"):
        t **= -1
