import pickle

import numpy as np
import pytest

import ndist


def test_numpy_shares_memory():
    t = ndist.zeros(3)
    a = t.numpy()
    a[0] = 5
    assert t[0].item() == 5
    assert np.asarray(t) is a
    assert np.asarray(t, dtype=np.float64).dtype == np.float64
    assert np.add(t, 1).tolist() == [6.0, 1.0, 1.0]


def test_numpy_operand_on_left_gives_tensor():
    out = np.arange(3) + ndist.tensor([1, 1, 1])
    assert isinstance(out, ndist.Tensor) and out.tolist() == [1, 2, 3]


def test_dlpack_roundtrip_with_numpy():
    t = ndist.arange(6, dtype=ndist.float32).reshape(2, 3)
    a = np.from_dlpack(t)
    a[0, 0] = 42
    assert t[0, 0].item() == 42
    assert t.__dlpack_device__() == (1, 0)
    back = ndist.from_dlpack(a)
    back[1, 2] = -1
    assert t[1, 2].item() == -1
    view = ndist.from_dlpack(t.T)  # strided views travel too
    assert view.shape == (3, 2) and view.stride() == (1, 3)


def test_from_dlpack_rejects_non_producers():
    with pytest.raises(TypeError, match="__dlpack__"):
        ndist.from_dlpack([1, 2, 3])


def test_cuda_array_interface_absent_on_cpu():
    t = ndist.zeros(2)
    assert not hasattr(t, "__cuda_array_interface__")


def test_pickle_roundtrip():
    t = ndist.arange(6).reshape(2, 3)[:, 1:]
    u = pickle.loads(pickle.dumps(t))
    assert u.equal(t) and u.dtype is t.dtype


@pytest.mark.torch
def test_torch_interop_both_ways():
    torch = pytest.importorskip("torch")
    t = ndist.arange(4, dtype=ndist.float32)
    tt = torch.from_dlpack(t)
    tt[0] = 10
    assert t[0].item() == 10
    src = torch.arange(3, dtype=torch.int32)
    n = ndist.from_dlpack(src)
    n[1] = 7
    assert src[1].item() == 7 and n.dtype is ndist.int32
    assert ndist.as_tensor(src).data_ptr() == src.data_ptr()
    assert ndist.tensor(torch.tensor([1.5, 2.5])).tolist() == [1.5, 2.5]
    assert torch.from_numpy(t.numpy()).tolist() == [10.0, 1.0, 2.0, 3.0]
    assert ndist.float32 is ndist.tensor([1], dtype=torch.float32).dtype


@pytest.mark.torch
def test_torch_bfloat16_shares_memory():
    torch = pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")
    src = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    n = ndist.from_dlpack(src)
    assert n.dtype is ndist.bfloat16 and n.tolist() == [1.5, -2.0]
    n[0] = 4.0
    assert src[0].item() == 4.0
    grad = torch.ones(2, requires_grad=True)
    assert ndist.from_dlpack(grad).tolist() == [1.0, 1.0]


def test_array_protocol_copy_false_refuses_a_conversion():
    t = ndist.tensor([1, 2], dtype=ndist.int32)
    assert np.asarray(t, dtype=np.int32, copy=False) is t.numpy()
    with pytest.raises(ValueError, match="needs a copy"):
        np.asarray(t, dtype=np.float64, copy=False)
    c = np.array(t, copy=True)
    c[0] = 5
    assert t[0].item() == 1
