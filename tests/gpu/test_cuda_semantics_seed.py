"""Every example of the CUDA-semantics seed page (shared/seeds/002), torch -> ndist.

Runs on a machine with CuPy and a GPU; lines that need a 2nd or 3rd GPU are
guarded by ``device_count()``."""

import pytest

import ndist
from tests.gpu._gpu import gpu_count  # fails the run on a GPU that cannot be used

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(gpu_count() == 0, reason="needs CuPy and a CUDA GPU")]


def _n():
    return ndist.cuda.device_count()


def test_page_devices_and_default_device():
    cuda = ndist.device("cuda")      # Default CUDA device
    cuda0 = ndist.device("cuda:0")
    cuda2 = ndist.device("cuda:2")   # GPU 2 (these are 0-indexed)
    assert (cuda.type, cuda.index, cuda0.index, cuda2.index) == ("cuda", None, 0, 2)

    ndist.cuda.set_device(0)
    x = ndist.tensor([1., 2.], device=cuda0)
    assert x.device == ndist.device(type="cuda", index=0)
    assert repr(x.device) == "device(type='cuda', index=0)"
    y = ndist.tensor([1., 2.]).cuda()
    assert repr(y.device) == "device(type='cuda', index=0)"
    assert repr(x) == "tensor([1., 2.], device='cuda:0')"


@pytest.mark.skipif(ndist.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_page_with_cuda_device_1():
    cuda = ndist.device("cuda")
    ndist.cuda.set_device(0)
    with ndist.cuda.device(1):
        # allocates a tensor on GPU 1
        a = ndist.tensor([1., 2.], device=cuda)
        # transfers a tensor from CPU to GPU 1
        b = ndist.tensor([1., 2.]).cuda()
        assert repr(a.device) == repr(b.device) == "device(type='cuda', index=1)"
        # You can also use ``Tensor.to`` to transfer a tensor:
        b2 = ndist.tensor([1., 2.]).to(device=cuda)
        assert b.device == b2.device == ndist.device("cuda", 1)
        c = a + b
        assert repr(c.device) == "device(type='cuda', index=1)"
        assert c.tolist() == [2., 4.]
    assert ndist.cuda.current_device() == 0  # the context restored the device


@pytest.mark.skipif(ndist.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_page_cross_gpu_ops_raise_and_copies_cross():
    x = ndist.tensor([1., 2.], device="cuda:0")
    with ndist.cuda.device(1):
        a = ndist.tensor([1., 2.], device="cuda")
        z = x + x  # results stay with their tensors, whatever device is current
        assert z.device == ndist.device("cuda:0")
    with pytest.raises(RuntimeError, match="cuda:0 and cuda:1"):
        x + a
    moved = x.to("cuda:1")
    assert moved.device.index == 1 and moved.tolist() == [1., 2.]
    assert x.cuda(1).device.index == 1
    dst = ndist.zeros(2, device="cuda:1")
    dst.copy_(x)
    assert dst.tolist() == [1., 2.]


@pytest.mark.skipif(ndist.cuda.device_count() < 3, reason="needs 3 GPUs")
def test_page_cuda2():
    t = ndist.tensor([1., 2.], device=ndist.device("cuda:2"))
    assert t.device == ndist.device("cuda", 2)


def test_ordinal_past_the_last_gpu_is_a_clear_error():
    n = _n()
    with pytest.raises(ValueError, match=f"CUDA ordinal {n} is out of range for {n} CUDA device"):
        ndist.tensor([1.], device=f"cuda:{n}")
    with pytest.raises(ValueError, match="out of range"):
        with ndist.cuda.device(n):
            pass
