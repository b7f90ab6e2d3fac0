import pytest

import ndist


def test_metadata():
    t = ndist.zeros(2, 3, dtype=ndist.float64)
    assert t.shape == (2, 3) and t.size() == ndist.Size([2, 3]) and t.size(-1) == 3
    assert repr(t.shape) == "ndist.Size([2, 3])"
    assert t.dim() == 2 and t.ndim == 2 and t.numel() == 6
    assert t.element_size() == 8 and t.nbytes == 48
    assert t.dtype is ndist.float64 and t.device == ndist.device("cpu")
    assert not t.is_cuda and t.is_cpu
    assert t.stride() == (3, 1) and t.stride(0) == 3


def test_indexing_returns_views_that_share_storage():
    t = ndist.arange(12).reshape(3, 4)
    row = t[1]
    row[0] = 100
    assert t[1, 0].item() == 100
    col = t[:, 2]
    col += 1
    assert t[:, 2].tolist() == [3, 7, 11]
    assert t[1, 2].dim() == 0
    t[1, 2].fill_(-5)  # a 0-d view, not a copy
    assert t.tolist()[1][2] == -5


def test_setitem_forms():
    t = ndist.zeros(5)
    t[1:3] = 7
    t[ndist.tensor([0, 4])] = ndist.tensor([1.0, 2.0])
    t[t == 7] = 3.5
    assert t.tolist() == [1.0, 3.5, 3.5, 0.0, 2.0]
    t[...] = ndist.tensor(9.0)
    assert t.tolist() == [9.0] * 5


def test_advanced_indexing_copies():
    t = ndist.arange(5)
    picked = t[ndist.tensor([0, 1])]
    picked[0] = 42
    assert t[0].item() == 0
    assert t[t > 2].tolist() == [3, 4]


def test_reshape_view_flatten():
    t = ndist.arange(6)
    v = t.view(2, 3)
    v[0, 0] = 9
    assert t[0].item() == 9
    assert t.view(-1, 2).shape == (3, 2)
    tt = v.T
    assert not tt.is_contiguous() and tt.stride() == (1, 3)
    with pytest.raises(ValueError, match=r"view: size \[6\].*use .reshape"):
        tt.view(6)
    assert tt.reshape(6).tolist() == [9, 3, 1, 4, 2, 5]
    assert tt.contiguous().is_contiguous()
    with pytest.raises(ValueError, match=r"shape \[4, 2\] is invalid for input of size 6"):
        t.reshape(4, 2)
    x = ndist.zeros(2, 3, 4)
    assert x.flatten().shape == (24,) and x.flatten(1).shape == (2, 12)
    assert x.flatten(0, 1).shape == (6, 4)
    assert ndist.tensor(3).flatten().shape == (1,)


def test_view_as_dtype_reinterprets():
    t = ndist.tensor([1.0], dtype=ndist.float32)
    assert t.view(ndist.int32).item() == 0x3F800000


def test_permute_transpose_squeeze_unsqueeze():
    x = ndist.zeros(2, 3, 4)
    assert x.permute(2, 0, 1).shape == (4, 2, 3)
    assert x.permute((1, 2, 0)).shape == (3, 4, 2)
    assert x.transpose(0, 2).stride() == (1, 4, 12)
    with pytest.raises(ValueError, match="dims has 1 entries"):
        x.permute(0)
    with pytest.raises(ValueError, match="repeat"):
        x.permute(0, 0, 1)
    y = ndist.zeros(1, 2, 1, 3)
    assert y.squeeze().shape == (2, 3)
    assert y.squeeze(0).shape == (2, 1, 3)
    assert y.squeeze(1).shape == (1, 2, 1, 3)  # not size 1: a no-op, as in torch
    assert ndist.zeros(3).unsqueeze(-1).shape == (3, 1)
    assert ndist.zeros(3).unsqueeze(0).shape == (1, 3)
    with pytest.raises(ValueError, match=r"range of \[-2, 1\], but got 3"):
        ndist.zeros(2).unsqueeze(3)
    assert ndist.zeros(2, 3).t().shape == (3, 2)
    assert ndist.zeros(2, 3).T.shape == (3, 2)


def test_expand_is_a_writable_view():
    base = ndist.tensor([[1], [2]])
    e = base.expand(2, 3)
    assert e.tolist() == [[1, 1, 1], [2, 2, 2]]
    assert e.stride() == (1, 0)
    assert base.expand(4, -1, 3).shape == (4, 2, 3)
    base[0, 0] = 5
    assert e[0].tolist() == [5, 5, 5]
    with pytest.raises(ValueError, match=r"expanded size of the tensor \(3\) must match the existing size \(2\)"):
        ndist.zeros(2, 3).expand(3, 3)


def test_chunk_like_torch():
    assert [c.tolist() for c in ndist.arange(10).chunk(3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [c.tolist() for c in ndist.arange(5).chunk(3)] == [[0, 1], [2, 3], [4]]
    assert len(ndist.arange(10).chunk(4)) == 4
    parts = ndist.arange(4).chunk(4)
    parts[2][0] = 99
    assert len(parts) == 4 and parts[0].shape == (1,)
    with pytest.raises(ValueError, match="greater than 0, got 0"):
        ndist.zeros(2).chunk(0)


def test_split_int_and_list():
    x = ndist.tensor([10, 11, 12, 13, 14, 15, 16, 17, 18])
    assert [p.tolist() for p in x.split([3, 2, 2, 2])] == [[10, 11, 12], [13, 14], [15, 16], [17, 18]]
    assert [p.tolist() for p in ndist.arange(10).split(4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    with pytest.raises(ValueError) as info:
        ndist.arange(10).split([3, 3])
    assert "[3, 3]" in str(info.value) and "sum to 6" in str(info.value) and "10" in str(info.value)
    with pytest.raises(TypeError, match="split_size_or_sections"):
        ndist.arange(10).split(2.5)


def test_unbind_and_iteration():
    x = ndist.arange(6).reshape(2, 3)
    cols = x.unbind(1)
    assert [c.tolist() for c in cols] == [[0, 3], [1, 4], [2, 5]]
    cols[0][0] = -1
    assert x[0, 0].item() == -1
    assert [r.tolist() for r in x] == [[-1, 1, 2], [3, 4, 5]]
    assert len(x) == 2
    with pytest.raises(TypeError, match="0-d"):
        len(ndist.tensor(1))


def test_cat_and_stack():
    assert ndist.cat([ndist.tensor([1, 2]), ndist.tensor([3.0])]).tolist() == [1.0, 2.0, 3.0]
    assert ndist.cat([ndist.tensor([1, 2]), ndist.tensor([3.0])]).dtype is ndist.float32
    assert ndist.cat([ndist.zeros(2, 3), ndist.ones(2, 1)], dim=1).shape == (2, 4)
    assert ndist.stack([ndist.tensor([1, 2]), ndist.tensor([3, 4])], dim=1).tolist() == [[1, 3], [2, 4]]
    with pytest.raises(ValueError, match=r"except in dimension 0.*\[2, 3\].*\[3, 2\]"):
        ndist.cat([ndist.zeros(2, 3), ndist.zeros(3, 2)])
    with pytest.raises(ValueError, match=r"equal size, but got \[2\] at entry 0 and \[3\] at entry 1"):
        ndist.stack([ndist.zeros(2), ndist.zeros(3)])
    with pytest.raises(TypeError, match="element 1 is list"):
        ndist.cat([ndist.zeros(2), [1, 2]])
    with pytest.raises(ValueError, match="non-empty"):
        ndist.stack([])


def test_narrow_and_flip():
    x = ndist.arange(6).reshape(2, 3)
    assert x.narrow(1, 1, 2).tolist() == [[1, 2], [4, 5]]
    assert x.flip(1).tolist() == [[2, 1, 0], [5, 4, 3]]
    with pytest.raises(ValueError, match="exceeds dimension size"):
        x.narrow(1, 2, 5)


def test_clone_copy_fill_zero():
    a = ndist.arange(3)
    b = a.clone()
    b[0] = 7
    assert a[0].item() == 0
    c = ndist.zeros(2, 3)
    c.copy_(ndist.tensor([1, 2, 3]))  # broadcast + cast
    assert c.tolist() == [[1.0, 2.0, 3.0]] * 2
    assert c.fill_(4).tolist() == [[4.0] * 3] * 2
    assert c.zero_().sum().item() == 0
    with pytest.raises(ValueError, match="0-dimension"):
        c.fill_(ndist.tensor([1.0, 2.0]))


def test_data_ptr_tracks_views():
    t = ndist.arange(4, dtype=ndist.int32)
    assert t[1:].data_ptr() == t.data_ptr() + 4
    assert t.numpy().ctypes.data == t.data_ptr()


def test_more_view_helpers():
    x = ndist.arange(10)
    assert [p.tolist() for p in x.tensor_split(3)] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert x.unflatten(0, (2, 5)).shape == (2, 5)
    y = ndist.zeros(2, 3, 4)
    assert y.swapaxes(0, 2).shape == (4, 3, 2) and y.mT.shape == (2, 4, 3)
    c = ndist.tensor([1 + 2j, 3 - 4j])
    c.real[0] = 10  # real/imag are views
    assert c.imag.tolist() == [2.0, -4.0] and c[0].item() == 10 + 2j
    with pytest.raises(TypeError, match="non-complex"):
        ndist.tensor([1.0]).imag
    assert ndist.tensor([1.0]).real.tolist() == [1.0]
    assert x.type() == "ndist.int64" and x.type(ndist.float64).dtype is ndist.float64
    with pytest.raises(ValueError, match="t\\(\\) expects a tensor with <= 2 dimensions"):
        y.t()
    with pytest.raises(ValueError, match="start_dim"):
        y.flatten(2, 1)
