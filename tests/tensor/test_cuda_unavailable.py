"""Without CuPy (this machine), every CUDA request fails loudly, never a CPU tensor."""

import importlib.util

import pytest

import ndist

pytestmark = pytest.mark.skipif(ndist.cuda.is_available(), reason="a GPU is available here")
NO_CUPY = importlib.util.find_spec("cupy") is None
REASON = "CuPy is not installed" if NO_CUPY else "CuPy is installed but no CUDA GPU was found"


def test_queries_do_not_raise():
    assert ndist.cuda.is_available() is False
    assert ndist.cuda.device_count() == 0


@pytest.mark.parametrize("make", [
    lambda: ndist.tensor([1.0, 2.0], device=ndist.device("cuda:0")),
    lambda: ndist.tensor([1.0, 2.0], device="cuda"),
    lambda: ndist.tensor([1.0, 2.0]).cuda(),
    lambda: ndist.tensor([1.0, 2.0]).to(device="cuda"),
    lambda: ndist.tensor([1.0, 2.0]).to("cuda:1"),
    lambda: ndist.zeros(2, device="cuda"),
    lambda: ndist.randn(2, device="cuda"),
    lambda: ndist.arange(3, device="cuda"),
    lambda: ndist.zeros_like(ndist.zeros(2), device="cuda"),
    lambda: ndist.zeros(2).copy_(ndist.zeros(2)).to(device=ndist.device("cuda", 0)),
    lambda: ndist.cuda.current_device(),
    lambda: ndist.cuda.set_device(0),
    lambda: ndist.cuda.synchronize(),
    lambda: ndist.cuda.Stream(),
    lambda: ndist.cuda.Event(),
    lambda: ndist.cuda.current_stream(),
    lambda: ndist.cuda.memory_allocated(),
    lambda: ndist.cuda.max_memory_allocated(),
    lambda: ndist.cuda.memory_reserved(),
    lambda: ndist.cuda.empty_cache(),
    lambda: ndist.cuda.get_device_name(0),
    lambda: ndist.cuda.manual_seed(1),
    lambda: ndist.cuda.device(1).__enter__(),
])
def test_cuda_requests_raise_saying_what_is_missing(make):
    with pytest.raises(RuntimeError, match=f"CUDA is not available: {REASON}"):
        make()


def test_seed_page_first_lines_fail_clearly():
    cuda0 = ndist.device("cuda:0")  # constructing a device needs no GPU, as in torch
    assert repr(cuda0) == "device(type='cuda', index=0)"
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        ndist.tensor([1.0, 2.0], device=cuda0)


def test_ordinal_check_names_ordinal_and_count():
    from ndist.tensor._cuda import check_ordinal

    with pytest.raises(ValueError, match=r"CUDA ordinal 0 is out of range for 0 CUDA device\(s\)"):
        check_ordinal(0)


def test_negative_set_device_is_a_noop_and_none_device_context_is_a_noop():
    ndist.cuda.set_device(-1)
    with ndist.cuda.device(None):
        pass
    ndist.cuda.manual_seed_all(3)  # no devices: nothing to seed


def test_cuda_numpy_message_shape():
    # On CPU tensors numpy() works; the CUDA TypeError is covered in tests/gpu.
    assert ndist.zeros(1).numpy().shape == (1,)
