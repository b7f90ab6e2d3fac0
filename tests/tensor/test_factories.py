import numpy as np
import pytest

import ndist
from tests.fresh_python import prints


def test_tensor_infers_torch_dtypes():
    assert ndist.tensor([1, 2]).dtype is ndist.int64
    assert ndist.tensor([1.0, 2]).dtype is ndist.float32
    assert ndist.tensor([True]).dtype is ndist.bool
    assert ndist.tensor([1 + 1j]).dtype is ndist.complex64
    assert ndist.tensor(3).dim() == 0
    assert ndist.tensor([]).dtype is ndist.float32 and ndist.tensor([]).shape == (0,)
    assert ndist.tensor(np.array([1, 2], dtype=np.int16)).dtype is ndist.int16
    assert ndist.tensor(np.float64(2.5)).dtype is ndist.float64
    assert ndist.tensor([[1, 2], [3, 4]], dtype=ndist.float64).dtype is ndist.float64


def test_tensor_copies():
    a = np.arange(3)
    t = ndist.tensor(a)
    a[0] = 100
    assert t[0].item() == 0
    u = ndist.tensor(t)
    u[1] = 50
    assert t[1].item() == 1


def test_tensor_bad_data():
    with pytest.raises(TypeError, match="got str"):
        ndist.tensor("abc")
    with pytest.raises(ValueError, match="rectangular"):
        ndist.tensor([[1, 2], [3]])
    with pytest.raises(TypeError, match="object|dtype"):
        ndist.tensor([object()])


def test_as_tensor_and_from_numpy_share_memory():
    a = np.arange(4, dtype=np.float32)
    t = ndist.as_tensor(a)
    f = ndist.from_numpy(a)
    a[0] = 9
    assert t[0].item() == 9 and f[0].item() == 9
    f[1] = 7
    assert a[1] == 7
    assert ndist.as_tensor(a, dtype=ndist.float64)[0].item() == 9  # converted: a copy
    assert ndist.as_tensor(t) is t
    assert ndist.as_tensor([1, 2]).dtype is ndist.int64
    with pytest.raises(TypeError, match="expected np.ndarray, got list"):
        ndist.from_numpy([1, 2])
    with pytest.raises(ValueError, match="byte order"):
        ndist.from_numpy(np.arange(3, dtype=">i4"))


def test_shape_factories():
    assert ndist.zeros(2, 3).tolist() == [[0.0] * 3] * 2
    assert ndist.zeros((2, 3)).shape == (2, 3) and ndist.zeros([4]).shape == (4,)
    assert ndist.ones(2, dtype=ndist.int32).tolist() == [1, 1]
    assert ndist.empty(3, 1).shape == (3, 1)
    assert ndist.zeros(size=(2,)).shape == (2,)
    assert ndist.full((2,), 7).dtype is ndist.int64
    assert ndist.full((2,), 7.0).dtype is ndist.float32
    assert ndist.full((2,), True).tolist() == [True, True]
    assert ndist.full((1,), 2, dtype=ndist.float64).dtype is ndist.float64
    assert ndist.eye(2).tolist() == [[1.0, 0.0], [0.0, 1.0]]
    with pytest.raises(ValueError, match="negative dimension -1"):
        ndist.zeros(-1)
    with pytest.raises(TypeError, match="sequence of ints"):
        ndist.zeros(2.5)
    with pytest.raises(TypeError, match="unexpected keyword"):
        ndist.zeros(2, colour="red")


def test_arange_linspace():
    assert ndist.arange(4).tolist() == [0, 1, 2, 3] and ndist.arange(4).dtype is ndist.int64
    assert ndist.arange(1, 4, 0.5).dtype is ndist.float32
    assert ndist.arange(5, 0, -2).tolist() == [5, 3, 1]
    assert ndist.arange(0, 1, 0.1).shape == (10,)
    assert ndist.arange(4, dtype=ndist.float64).dtype is ndist.float64
    assert ndist.linspace(0, 1, 5).tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert ndist.linspace(0, 10, 4, dtype=ndist.int64).tolist() == [0, 3, 6, 10]
    with pytest.raises(ValueError, match="step must be nonzero"):
        ndist.arange(0, 10, 0)
    with pytest.raises(ValueError, match="inconsistent with step sign"):
        ndist.arange(10, 0, 1)
    with pytest.raises(ValueError, match="non-negative"):
        ndist.linspace(0, 1, -1)


def test_random_is_seeded_and_typed():
    ndist.manual_seed(123)
    a = ndist.rand(3)
    b = ndist.randn(2, 2, dtype=ndist.float64)
    c = ndist.randint(3, 10, (5,))
    ndist.manual_seed(123)
    assert ndist.rand(3).equal(a) and ndist.randn(2, 2, dtype=ndist.float64).equal(b)
    assert ndist.randint(3, 10, (5,)).equal(c)
    assert a.dtype is ndist.float32 and b.dtype is ndist.float64 and c.dtype is ndist.int64
    assert ((a >= 0) & (a < 1)).all().item()
    assert ((c >= 3) & (c < 10)).all().item()
    assert ndist.randint(10, (2, 2)).shape == (2, 2)
    assert ndist.randn(4, dtype=ndist.cfloat).dtype is ndist.complex64
    g = ndist.Generator().manual_seed(5)
    x = ndist.rand(4, generator=g)
    assert ndist.rand(4, generator=ndist.Generator().manual_seed(5)).equal(x)
    assert ndist.initial_seed() == 123
    with pytest.raises(TypeError, match="floating point"):
        ndist.rand(2, dtype=ndist.int64)
    with pytest.raises(ValueError, match="low < high"):
        ndist.randint(5, 5, (2,))
    with pytest.raises(TypeError, match="size must be given as a tuple"):
        ndist.randint(5)


def test_like_factories():
    t = ndist.tensor([[1, 2]], dtype=ndist.int32)
    assert ndist.zeros_like(t).dtype is ndist.int32 and ndist.zeros_like(t).shape == (1, 2)
    assert ndist.ones_like(t, dtype=ndist.float64).tolist() == [[1.0, 1.0]]
    assert ndist.full_like(t, 3.7).tolist() == [[3, 3]]
    assert ndist.empty_like(t).shape == (1, 2)
    assert ndist.rand_like(t.float()).dtype is ndist.float32
    assert ndist.randn_like(t.double()).dtype is ndist.float64
    r = ndist.randint_like(t, 5)
    assert r.dtype is ndist.int32 and ((r >= 0) & (r < 5)).all().item()
    with pytest.raises(TypeError, match="expected an ndist.Tensor"):
        ndist.zeros_like([1, 2])


def test_legacy_tensor_constructor():
    assert ndist.Tensor([1, 2]).dtype is ndist.float32
    assert ndist.Tensor(2, 3).shape == (2, 3)


def test_new_factories_inherit_dtype_and_device():
    t = ndist.tensor([1, 2], dtype=ndist.int16)
    assert t.new_zeros(2, 2).dtype is ndist.int16 and t.new_zeros(2, 2).shape == (2, 2)
    assert t.new_ones((3,)).tolist() == [1, 1, 1]
    assert t.new_full((2,), 7).tolist() == [7, 7] and t.new_full((2,), 7).dtype is ndist.int16
    assert t.new_empty(0).shape == (0,)
    assert t.new_tensor([1.5], dtype=ndist.float64).dtype is ndist.float64
    assert t.new_tensor([3]).dtype is ndist.int16
    assert ndist.Tensor().shape == (0,)


def test_contains():
    t = ndist.tensor([[1, 2], [3, 4]])
    assert 3 in t and 5 not in t and ndist.tensor(4) in t
    with pytest.raises(TypeError, match="only supports Tensor or scalar"):
        "x" in t


def test_requires_grad_is_refused_not_ignored():
    with pytest.raises(ValueError, match="requires_grad=True is not supported"):
        ndist.tensor([1.0], requires_grad=True)
    with pytest.raises(ValueError, match="zeros: requires_grad"):
        ndist.zeros(2, requires_grad=True)
    assert ndist.ones(1, requires_grad=False).tolist() == [1.0]


@pytest.mark.timeout(60)
def test_importing_ndist_does_not_import_numpy_random():
    # numpy.random costs every rank ~5 ms at import; the generators make theirs on first use.
    code = (
        "import sys, ndist\n"
        "t = ndist.ones(2)\n"
        "assert 'numpy.random' not in sys.modules, 'numpy.random imported eagerly'\n"
        "ndist.manual_seed(7); a = ndist.rand(3).numpy()\n"
        "g = ndist.Generator().manual_seed(7); b = ndist.rand(3, generator=g).numpy()\n"
        "assert (a == b).all(), (a, b)\n"
        "print('ok')\n"
    )
    assert prints(code, timeout=50) == "ok"
