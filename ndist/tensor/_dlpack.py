"""DLPack interop: ``from_dlpack`` for any producer (NumPy, CuPy, torch, JAX, ...)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._tensor import Tensor

__all__ = ["from_dlpack"]

_KDLCPU, _KDLCUDA, _KDLCUDAHOST, _KDLCUDAMANAGED = 1, 2, 3, 13


def from_dlpack(ext_tensor: Any) -> Tensor:
    """A tensor sharing memory with ``ext_tensor`` (any object with ``__dlpack__``).

    CPU producers are wrapped as NumPy arrays, CUDA producers as CuPy arrays on
    the producer's GPU; nothing is copied."""
    if isinstance(ext_tensor, Tensor):
        return ext_tensor
    if not hasattr(ext_tensor, "__dlpack__") or not hasattr(ext_tensor, "__dlpack_device__"):
        raise TypeError(f"from_dlpack: expected an object with __dlpack__ and __dlpack_device__ "
                        f"(a NumPy/CuPy array or a torch tensor), got {type(ext_tensor).__name__}")
    if type(ext_tensor).__module__.startswith("torch"):
        ext_tensor = ext_tensor.detach()  # torch refuses DLPack export of grad-tracking tensors
        if str(getattr(ext_tensor, "dtype", "")) == "torch.bfloat16":
            # NumPy's DLPack import has no bfloat16: move the bits as int16, then relabel.
            import torch  # noqa: PLC0415 - the producer is a torch tensor, so torch is loaded

            from ._dtype import to_dtype  # noqa: PLC0415

            bits = from_dlpack(ext_tensor.view(torch.int16))._data
            return Tensor._wrap(bits.view(to_dtype("bfloat16").numpy_dtype))
    dev_type, dev_id = ext_tensor.__dlpack_device__()
    if int(dev_type) in (_KDLCPU, _KDLCUDAHOST):
        arr = np.from_dlpack(ext_tensor)
    elif int(dev_type) in (_KDLCUDA, _KDLCUDAMANAGED):
        from ._cuda import check_ordinal, require_cupy  # noqa: PLC0415

        cp = require_cupy()
        check_ordinal(int(dev_id), arg="from_dlpack")
        with cp.cuda.Device(int(dev_id)):
            arr = cp.from_dlpack(ext_tensor)
    else:
        raise TypeError(f"from_dlpack: unsupported DLPack device type {int(dev_type)} "
                        f"(ndist supports CPU (1) and CUDA (2))")
    from ._dtype import from_numpy_dtype  # noqa: PLC0415

    from_numpy_dtype(arr.dtype, what="from_dlpack")
    return Tensor._wrap(arr)
