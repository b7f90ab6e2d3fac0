"""CUDA tensors on CuPy: storage, ops, transfers, interop, streams, events, memory."""

import numpy as np
import pytest

import ndist
from tests.gpu._gpu import gpu_count  # fails the run on a GPU that cannot be used

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(gpu_count() == 0, reason="needs CuPy and a CUDA GPU")]


@pytest.fixture(autouse=True)
def _device0():
    ndist.cuda.set_device(0)
    yield
    ndist.cuda.set_device(0)


def test_storage_is_cupy_on_the_right_device():
    import cupy

    t = ndist.zeros(3, device="cuda")
    assert isinstance(t._data, cupy.ndarray) and t._data.device.id == 0
    assert t.is_cuda and not t.is_cpu and t.device == ndist.device("cuda:0")
    assert ndist.cuda.current_device() == 0 and ndist.cuda.device_count() >= 1
    assert isinstance(ndist.cuda.get_device_name(0), str)
    props = ndist.cuda.get_device_properties(0)
    assert props.name == ndist.cuda.get_device_name() and props.total_memory > 0
    assert ndist.cuda.get_device_capability(0) == (props.major, props.minor) and props.major >= 3


def test_ops_stay_on_device_and_match_cpu():
    a = ndist.arange(6, dtype=ndist.float32).reshape(2, 3)
    g = a.cuda()
    for f in (lambda t: t + 1.5, lambda t: t * t, lambda t: t / 2, lambda t: t.sum(0),
              lambda t: t.mean(), lambda t: t.max(1).values, lambda t: t @ t.T,
              lambda t: (t > 2).sum(), lambda t: -t, lambda t: t.T.contiguous()):
        out = f(g)
        assert out.is_cuda
        np.testing.assert_allclose(out.cpu().numpy(), f(a).numpy(), rtol=1e-6)
    g += 1
    assert g.cpu().tolist() == [[1., 2., 3.], [4., 5., 6.]]
    assert (ndist.tensor([1, 2], device="cuda") + 1.5).dtype is ndist.float32


def test_views_share_device_storage():
    g = ndist.zeros(4, device="cuda")
    v = g[1:3]
    v.fill_(5)
    g[0] = ndist.tensor(2.0)  # 0-d CPU tensor into a CUDA tensor is allowed
    assert g.tolist() == [2., 5., 5., 0.]
    assert v.data_ptr() == g.data_ptr() + 4
    idx = ndist.tensor([0, 3])  # CPU index into a CUDA tensor
    assert g[idx].tolist() == [2., 0.]


def test_cpu_gpu_mixing_raises_naming_both():
    with pytest.raises(RuntimeError, match="cuda:0 and cpu"):
        ndist.zeros(2, device="cuda") + ndist.zeros(2)
    with pytest.raises(RuntimeError, match="cpu and cuda:0"):
        ndist.cat([ndist.zeros(2), ndist.zeros(2, device="cuda")])
    assert (ndist.zeros(2, device="cuda") + ndist.tensor(1.0)).is_cuda  # 0-d CPU: a scalar
    r = ndist.tensor(10.0) - ndist.ones(2, device="cuda")  # ... on either side
    assert r.is_cuda and r.tolist() == [9.0, 9.0]


def test_transfers_and_copy():
    c = ndist.arange(4)
    g = c.to("cuda")
    assert g.cpu().equal(c) and g.cpu() is not c
    assert g.to("cuda") is g and g.cuda() is g
    assert g.to("cuda", copy=True) is not g
    assert g.to(ndist.float64).dtype is ndist.float64 and g.to(ndist.float64).is_cuda
    dst = ndist.empty(4)
    dst.copy_(g)
    assert dst.tolist() == [0, 1, 2, 3]
    back = ndist.zeros(4, device="cuda", dtype=ndist.float32)
    back.copy_(c)
    assert back.tolist() == [0., 1., 2., 3.]


def test_numpy_raises_like_torch():
    g = ndist.zeros(2, device="cuda")
    with pytest.raises(TypeError, match="can't convert cuda:0 device type tensor to numpy"):
        g.numpy()
    with pytest.raises(TypeError, match="cuda:0"):
        np.asarray(g)
    assert g.numpy(force=True).tolist() == [0., 0.]


def test_cuda_array_interface_and_dlpack_with_cupy():
    import cupy

    g = ndist.arange(4, dtype=ndist.float32, device="cuda")
    c = cupy.asarray(g)  # __cuda_array_interface__: no copy
    c[0] = 9
    assert g[0].item() == 9
    d = cupy.from_dlpack(g)
    d[1] = 8
    assert g[1].item() == 8
    assert g.__dlpack_device__()[0] == 2
    back = ndist.from_dlpack(cupy.arange(3))
    assert back.is_cuda and back.tolist() == [0, 1, 2]
    assert ndist.as_tensor(c).data_ptr() == g.data_ptr()


def test_torch_cuda_interop():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    g = ndist.arange(3, dtype=ndist.float32, device="cuda")
    tt = torch.from_dlpack(g)
    tt[0] = 5
    assert g[0].item() == 5
    n = ndist.from_dlpack(torch.ones(2, device="cuda"))
    assert n.is_cuda and n.tolist() == [1., 1.]


def test_repr_has_device_suffix():
    assert repr(ndist.tensor([1, 2], device="cuda", dtype=ndist.int32)) == \
        "tensor([1, 2], device='cuda:0', dtype=ndist.int32)"


def test_random_on_device_is_seeded():
    ndist.manual_seed(7)
    a = ndist.randn(5, device="cuda")
    ndist.manual_seed(7)
    b = ndist.randn(5, device="cuda")
    assert a.is_cuda and a.equal(b)
    r = ndist.randint(0, 3, (100,), device="cuda")
    assert r.is_cuda and ((r >= 0) & (r < 3)).all().item()


def test_streams_and_events():
    s = ndist.cuda.Stream()
    assert s.device == ndist.device("cuda:0")
    start = ndist.cuda.Event(enable_timing=True)
    end = ndist.cuda.Event(enable_timing=True)
    with ndist.cuda.stream(s):
        assert ndist.cuda.current_stream() == s
        start.record()
        x = ndist.ones(1 << 20, device="cuda") * 2
        end.record()
    assert ndist.cuda.current_stream() != s
    ndist.cuda.current_stream().wait_stream(s)
    end.synchronize()
    assert end.query() and start.elapsed_time(end) >= 0
    ndist.cuda.synchronize()
    assert s.query()
    assert x.sum().item() == 2 * (1 << 20)
    assert ndist.cuda.default_stream().cuda_stream == 0


def test_memory_statistics():
    ndist.cuda.empty_cache()
    base = ndist.cuda.memory_allocated()
    t = ndist.empty(1 << 20, device="cuda")  # 4 MiB
    assert ndist.cuda.memory_allocated() >= base + 4 * (1 << 20)
    assert ndist.cuda.max_memory_allocated() >= ndist.cuda.memory_allocated()
    assert ndist.cuda.memory_reserved() >= ndist.cuda.memory_allocated()
    del t
    assert ndist.cuda.memory_allocated() <= base + 4 * (1 << 20) - 1
    ndist.cuda.reset_peak_memory_stats()
    assert ndist.cuda.max_memory_allocated() == ndist.cuda.memory_allocated()
    free, total = ndist.cuda.mem_get_info()
    assert 0 < free <= total


@pytest.mark.skipif(ndist.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_allocating_ops_on_a_non_current_gpu_stay_there():
    ndist.cuda.set_device(0)
    t = ndist.arange(6, dtype=ndist.float32, device="cuda:1").reshape(2, 3)
    outs = [t.T.reshape(-1), t.T.contiguous(), t[ndist.tensor([1, 0])], t + t.double(),
            t.sum(0), t.max(1).indices, t.argmax(), t.clone(), t.int() // 2,
            t.div(4, rounding_mode="trunc"), ndist.cat([t, t]), t.flip(0)]
    for out in outs:
        assert out.device == ndist.device("cuda:1")
    assert ndist.cuda.current_device() == 0
    assert outs[0].tolist() == [0., 3., 1., 4., 2., 5.]
