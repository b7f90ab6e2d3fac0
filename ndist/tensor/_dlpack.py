"""DLPack import: the array behind any producer (NumPy, CuPy, torch, JAX, ...).

``array_from_dlpack`` knows nothing of ``Tensor``; ``ndist.from_dlpack`` (in
``_factories``) wraps what it returns."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._cuda import check_ordinal, require_cupy
from ._dtype import from_numpy_dtype, to_dtype

__all__ = ["array_from_dlpack"]

_KDLCPU, _KDLCUDA, _KDLCUDAHOST, _KDLCUDAMANAGED = 1, 2, 3, 13


def array_from_dlpack(ext_tensor: Any) -> Any:
    """A NumPy (CPU producers) or CuPy (CUDA producers, on the producer's GPU) array
    sharing memory with ``ext_tensor``; nothing is copied."""
    if not hasattr(ext_tensor, "__dlpack__") or not hasattr(ext_tensor, "__dlpack_device__"):
        raise TypeError(f"from_dlpack: expected an object with __dlpack__ and __dlpack_device__ "
                        f"(a NumPy/CuPy array or a torch tensor), got {type(ext_tensor).__name__}")
    if type(ext_tensor).__module__.startswith("torch"):
        ext_tensor = ext_tensor.detach()  # torch refuses DLPack export of grad-tracking tensors
        if str(getattr(ext_tensor, "dtype", "")) == "torch.bfloat16":
            # NumPy's DLPack import has no bfloat16: move the bits as int16, then relabel.
            # torch is imported here, not at the top: ndist never imports it itself, and the
            # producer is a torch tensor, so torch is already loaded.
            import torch  # noqa: PLC0415

            bits = array_from_dlpack(ext_tensor.view(torch.int16))
            return bits.view(to_dtype("bfloat16").numpy_dtype)
    dev_type, dev_id = ext_tensor.__dlpack_device__()
    if int(dev_type) in (_KDLCPU, _KDLCUDAHOST):
        arr = np.from_dlpack(ext_tensor)
    elif int(dev_type) in (_KDLCUDA, _KDLCUDAMANAGED):
        cp = require_cupy()
        check_ordinal(int(dev_id), arg="from_dlpack")
        with cp.cuda.Device(int(dev_id)):
            arr = cp.from_dlpack(ext_tensor)
    else:
        raise TypeError(f"from_dlpack: unsupported DLPack device type {int(dev_type)} "
                        f"(ndist supports CPU (1) and CUDA (2))")
    from_numpy_dtype(arr.dtype, what="from_dlpack")
    return arr
