"""ndist against torch itself, where torch is importable (skipped otherwise): result
dtypes of every dtype pair and scalar kind, values of the element-wise ops, and repr."""

import numpy as np
import pytest

import ndist

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

NAMES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64",
         "complex64", "complex128"]
SCALARS = [True, 3, -2, 2.5, 1 + 1j]


def _want(torch_dtype):
    # torch promotes float16 with complex to complex32, which NumPy cannot store;
    # ndist uses complex64 there (documented in docs/tensor.md).
    name = str(torch_dtype).replace("torch.", "")
    return "complex64" if name == "complex32" else name


def _pair(name, zero_dim):
    arr = np.array(2 if zero_dim else [1, 2], dtype=np.dtype(name))
    return ndist.from_numpy(arr.copy()), torch.from_numpy(arr.copy())


@pytest.mark.parametrize("a", NAMES)
def test_promotion_of_every_pair_matches_torch(a):
    for b in NAMES:
        for za, zb in ((False, False), (False, True), (True, False), (True, True)):
            na, ta = _pair(a, za)
            nb, tb = _pair(b, zb)
            rt = torch.result_type(ta, tb)
            assert ndist.result_type(na, nb)._name == _want(rt), (a, za, b, zb)
            if rt != torch.complex32:  # torch has few complex32 kernels
                assert (na * nb).dtype._name == _want((ta * tb).dtype), (a, za, b, zb)
        for s in SCALARS:
            want = _want(torch.result_type(_pair(a, False)[1], s))
            assert ndist.result_type(_pair(a, False)[0], s)._name == want, (a, s)


OPS = {
    "add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
    "div": lambda x, y: x / y, "floordiv": lambda x, y: x // y, "mod": lambda x, y: x % y,
    "pow": lambda x, y: x ** y, "lt": lambda x, y: x < y, "eq": lambda x, y: x == y,
}


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("dt", ["int32", "int64", "float32", "float64"])
def test_elementwise_values_match_torch(op, dt):
    rng = np.random.default_rng(0)
    x = rng.integers(-6, 7, (3, 4)).astype(dt)
    y = rng.integers(1, 4, (4,)).astype(dt)  # positive: no int division by zero / negative powers
    got = OPS[op](ndist.from_numpy(x), ndist.from_numpy(y))
    want = OPS[op](torch.from_numpy(x), torch.from_numpy(y))
    assert got.dtype._name == str(want.dtype).replace("torch.", "")
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    for s in (2, 1.5):
        got = OPS[op](ndist.from_numpy(x), s)
        want = OPS[op](torch.from_numpy(x), s)
        assert got.dtype._name == str(want.dtype).replace("torch.", "")
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)


def _arrays():
    rng = np.random.default_rng(1)
    yield rng.standard_normal(7).astype(np.float32)
    yield (rng.standard_normal((3, 5)) * 1e6).astype(np.float64)
    yield (rng.standard_normal((2, 3, 4)) * 1e-6).astype(np.float32)
    yield rng.integers(-1000, 1000, (4, 6)).astype(np.int16)
    yield rng.integers(0, 2, (9,)).astype(bool)
    yield (rng.standard_normal(5) + 1j * rng.standard_normal(5)).astype(np.complex64)
    yield rng.standard_normal(1500).astype(np.float32)
    yield rng.integers(0, 10**9, (40, 40)).astype(np.int64)
    yield np.array([np.nan, -np.inf, 0.0, 3.25], dtype=np.float32)
    yield np.arange(24, dtype=np.float16).reshape(2, 3, 4) / 3
    yield np.zeros((0, 2), dtype=np.int32)


@pytest.mark.parametrize("i", range(11))
def test_repr_matches_torch(i):
    arr = list(_arrays())[i]
    assert repr(ndist.from_numpy(arr)) == repr(torch.from_numpy(arr)).replace("torch.", "ndist.")


REPR_EXPRS = [
    "T.tensor([[1.5] * 30] * 3)",
    "T.arange(40.).reshape(2, 20) * 1e5",
    "T.arange(2000, dtype=T.float64).reshape(40, 50) / 3",
    "T.tensor([[True, False] * 20] * 2)",
    "(T.arange(1200, dtype=T.float32) * (1 + 2j)).to(T.cfloat)",
    "T.tensor(1 + 1j)",
    "T.tensor(-0.5 - 2j, dtype=T.cdouble)",
    "T.tensor([1e-10, 1e10])",
    "T.tensor([[1, -1], [100000, 2]], dtype=T.int32)",
    "T.zeros(3, 0, 2)",
    "T.ones(2, 2, 2, 2, dtype=T.int8)",
    "T.tensor([0.1, 0.2, 0.3]) * 3",
    "T.tensor([65504.], dtype=T.float16)",
    "T.tensor([1., float('nan')], dtype=T.cfloat)",
    "T.tensor([[1.5, float('nan')], [1e-20, 3.]])",
    "T.arange(100).reshape(1, 100)",
    "T.arange(6).reshape(2, 3).max(1)",
    "T.tensor([1, 2]).dtype",
    "T.tensor([[1, 2]]).shape",
    "T.device('cuda', 1)",
]


@pytest.mark.parametrize("expr", REPR_EXPRS)
def test_repr_of_expressions_matches_torch(expr):
    want = repr(eval(expr, {"T": torch})).replace("torch.", "ndist.")
    assert repr(eval(expr, {"T": ndist})) == want
