"""``ndist.Tensor``: a thin, torch-like wrapper over one NumPy or CuPy array.

``t._data`` is the array (any strides); views share it, and ``Tensor._wrap``
wraps an array without copying. Arithmetic, comparisons and reductions live in
``_ops.TensorOps``; conversions across devices in ``_transfer``.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from . import _dtype as D
from ._device import CPU, device
from ._ops import TensorOps, check_same_device, to_operand_array
from ._reductions import ReductionOps
from ._views import ViewOps, norm_dim as _dim
from ._transfer import move

__all__ = ["Tensor", "Size", "is_tensor"]


class Size(tuple):
    """A tensor's shape: a tuple of ints (``ndist.Size([2, 3])``)."""

    __slots__ = ()

    def numel(self) -> int:
        n = 1
        for s in self:
            n *= s
        return n

    def __repr__(self) -> str:
        return f"ndist.Size({list(self)!r})"

    def __getitem__(self, key):
        out = tuple.__getitem__(self, key)
        return Size(out) if isinstance(key, slice) else out


def is_tensor(obj: Any) -> bool:
    return isinstance(obj, Tensor)


def _index_arg(idx: Any, data: Any) -> Any:
    """Turn tensors inside an index into arrays of the indexed array's kind."""
    if isinstance(idx, Tensor):
        arr = idx._data
        if type(arr) is not type(data):
            arr = move(arr, data)
        return arr
    if isinstance(idx, tuple):
        return tuple(_index_arg(i, data) for i in idx)
    return idx


class Tensor(ViewOps, TensorOps, ReductionOps):
    """A multi-dimensional array on the CPU (NumPy) or a CUDA GPU (CuPy)."""

    __array_priority__ = 1000  # ndarray (op) Tensor defers to Tensor's reflected op
    _data: Any

    def __new__(cls, *args: Any, **kwargs: Any):
        # Legacy torch.Tensor(...) constructor: Tensor([1, 2]) or Tensor(2, 3) (float).
        from ._factories import empty, tensor  # noqa: PLC0415

        if not args:
            return empty(0, **kwargs)
        if len(args) == 1 and not isinstance(args[0], (numbers.Integral, tuple)):
            return tensor(args[0], dtype=D.get_default_dtype(), **kwargs)
        return empty(*args, **kwargs)

    @classmethod
    def _wrap(cls, array: Any) -> "Tensor":
        """Wrap a NumPy / CuPy array without copying."""
        t = object.__new__(cls)
        if type(array) is np.ndarray or hasattr(array, "__cuda_array_interface__"):
            t._data = array
        else:
            t._data = np.asarray(array)
        return t

    def __reduce_ex__(self, protocol: int):
        # Plain pickling copies the array; ndist.multiprocessing registers its own
        # reducers for shared-memory tensors, and those take precedence.
        return (_rebuild_tensor, (self._data,))

    # ------------------------------------------------------------ metadata
    @property
    def shape(self) -> Size:
        return Size(self._data.shape)

    def size(self, dim: int | None = None):
        if dim is None:
            return Size(self._data.shape)
        return self._data.shape[_dim(dim, self._data.ndim)]

    @property
    def dtype(self) -> D.dtype:
        try:
            return D._FROM_NP[self._data.dtype]
        except KeyError:
            return D.from_numpy_dtype(self._data.dtype, what="Tensor.dtype")  # TypeError

    @property
    def device(self) -> device:
        arr = self._data
        if type(arr) is np.ndarray:
            return CPU
        return device("cuda", int(arr.device.id))

    @property
    def is_cuda(self) -> bool:
        return type(self._data) is not np.ndarray

    @property
    def is_cpu(self) -> bool:
        return type(self._data) is np.ndarray

    @property
    def ndim(self) -> int:
        return self._data.ndim

    def dim(self) -> int:
        return self._data.ndim

    ndimension = dim

    def numel(self) -> int:
        return int(self._data.size)

    nelement = numel

    def element_size(self) -> int:
        return self._data.itemsize

    @property
    def itemsize(self) -> int:
        return self._data.itemsize

    @property
    def nbytes(self) -> int:
        return int(self._data.size) * self._data.itemsize

    def stride(self, dim: int | None = None):
        st = tuple(s // self._data.itemsize for s in self._data.strides)
        return st if dim is None else st[_dim(dim, self._data.ndim)]

    def is_contiguous(self) -> bool:
        return bool(self._data.flags.c_contiguous)

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point

    def is_complex(self) -> bool:
        return self.dtype.is_complex

    def data_ptr(self) -> int:
        """Address of the first element (like torch, storage offset included)."""
        arr = self._data
        if type(arr) is np.ndarray:
            return int(arr.__array_interface__["data"][0])
        return int(arr.data.ptr)

    @property
    def requires_grad(self) -> bool:
        return False  # ndist has no autograd

    @property
    def data(self) -> "Tensor":
        return self._wrap(self._data)

    def detach(self) -> "Tensor":
        return self._wrap(self._data)

    @property
    def real(self) -> "Tensor":
        return self._wrap(self._data.real)

    @property
    def imag(self) -> "Tensor":
        if not self.dtype.is_complex:
            raise TypeError(f"imag is not implemented for tensors with non-complex dtype {self.dtype}")
        return self._wrap(self._data.imag)

    # ------------------------------------------------------------ indexing
    def __getitem__(self, idx: Any) -> "Tensor":
        arr = self._data
        idx = _index_arg(idx, arr)
        with self._guard():  # advanced indexing allocates (on the array's GPU)
            out = arr[idx]
            if not hasattr(out, "shape") or type(out) is not type(arr):
                # A full integer index gives a NumPy scalar: index again for a 0-d view.
                out = arr[(idx if isinstance(idx, tuple) else (idx,)) + (Ellipsis,)]
        return self._wrap(out)

    def __setitem__(self, idx: Any, value: Any) -> None:
        arr = self._data
        if isinstance(value, Tensor):
            check_same_device("__setitem__", self, value, allow_cpu_scalar=True)
        with self._guard():
            arr[_index_arg(idx, arr)] = to_operand_array(value, arr)

    def __len__(self) -> int:
        if self._data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self._data.shape[0]

    def __iter__(self):
        if self._data.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return iter(self.unbind(0))

    def __hash__(self) -> int:
        return id(self)

    def __contains__(self, element: Any) -> bool:
        """``x in t``: whether any element equals ``x`` (one vectorised compare)."""
        if not isinstance(element, (Tensor, numbers.Number, np.generic)):
            raise TypeError(f"Tensor.__contains__ only supports Tensor or scalar, but you "
                            f"passed in a {type(element).__name__}")
        return bool((self == element).any().item())

    # ------------------------------------------------------------ new_* factories
    def new_empty(self, *size: Any, dtype: Any = None, device: Any = None) -> "Tensor":
        """An uninitialised tensor with this tensor's dtype and device by default."""
        from ._factories import empty  # noqa: PLC0415

        return empty(*size, dtype=dtype or self.dtype, device=device or self.device)

    def new_zeros(self, *size: Any, dtype: Any = None, device: Any = None) -> "Tensor":
        from ._factories import zeros  # noqa: PLC0415

        return zeros(*size, dtype=dtype or self.dtype, device=device or self.device)

    def new_ones(self, *size: Any, dtype: Any = None, device: Any = None) -> "Tensor":
        from ._factories import ones  # noqa: PLC0415

        return ones(*size, dtype=dtype or self.dtype, device=device or self.device)

    def new_full(self, size: Any, fill_value: Any, *, dtype: Any = None,
                 device: Any = None) -> "Tensor":
        from ._factories import full  # noqa: PLC0415

        return full(size, fill_value, dtype=dtype or self.dtype, device=device or self.device)

    def new_tensor(self, data: Any, *, dtype: Any = None, device: Any = None) -> "Tensor":
        from ._factories import tensor  # noqa: PLC0415

        return tensor(data, dtype=dtype or self.dtype, device=device or self.device)

    # ------------------------------------------------------------ conversion
    def to(self, *args: Any, **kwargs: Any) -> "Tensor":
        """``to(dtype)``, ``to(device, dtype=None)``, ``to(other)``; ``copy=True`` forces a copy."""
        dev = kwargs.pop("device", None)
        dt = kwargs.pop("dtype", None)
        copy = kwargs.pop("copy", False)
        kwargs.pop("non_blocking", None)
        kwargs.pop("memory_format", None)
        if kwargs:
            raise TypeError(f"to: unexpected keyword arguments {sorted(kwargs)}")
        flags = []
        for a in args:
            if isinstance(a, Tensor):
                dev, dt = a.device, a.dtype
            elif isinstance(a, D.dtype):
                dt = a
            elif isinstance(a, bool):
                flags.append(a)  # positional (non_blocking, copy)
            elif isinstance(a, (str, device, numbers.Integral)):
                dev = a
            else:
                raise TypeError(f"to: expected a device, dtype or tensor, got {a!r} "
                                f"of type {type(a).__name__}")
        if len(flags) > 1:
            copy = flags[1]
        return self._convert(dev, None if dt is None else D.to_dtype(dt), copy)

    def _convert(self, dev: Any, dt: D.dtype | None, copy: bool) -> "Tensor":
        from ._cuda import resolve  # noqa: PLC0415

        arr = self._data
        target = self.device if dev is None else resolve(dev)
        np_dt = arr.dtype if dt is None else dt.numpy_dtype
        if target == self.device:
            if np_dt == arr.dtype:
                return self.clone() if copy else self
            with self._guard():
                return self._wrap(arr.astype(np_dt))
        out = move(arr, target)
        return self._wrap(out if np_dt == out.dtype else out.astype(np_dt, copy=False))

    def cuda(self, device: Any = None, non_blocking: bool = False) -> "Tensor":  # noqa: A002
        if device is None:
            device = "cuda"
        elif isinstance(device, numbers.Integral) and not isinstance(device, bool):
            device = f"cuda:{device}"
        return self._convert(device, None, False)

    def cpu(self) -> "Tensor":
        return self._convert(CPU, None, False)

    def numpy(self, *, force: bool = False) -> np.ndarray:
        """The NumPy array itself (shares memory); CUDA tensors raise unless ``force``."""
        if type(self._data) is np.ndarray:
            return self._data
        if force:
            return self.cpu()._data
        raise TypeError(f"can't convert {self.device} device type tensor to numpy. "
                        f"Use Tensor.cpu() to copy the tensor to host memory first.")

    def tolist(self) -> Any:
        arr = self._data if type(self._data) is np.ndarray else self.cpu()._data
        if arr.dtype.kind == "V" or arr.dtype.name == "bfloat16":
            arr = arr.astype(np.float32)
        return arr.tolist()

    def item(self) -> Any:
        n = self._data.size
        if n != 1:
            raise ValueError(f"item: a Tensor with {n} elements cannot be converted to Scalar")
        return self.reshape(()).tolist()

    def __bool__(self) -> bool:
        n = self._data.size
        if n != 1:
            raise ValueError(f"Boolean value of Tensor with {'more than one value' if n else 'no values'} "
                             f"is ambiguous")
        return bool(self.item())

    def __int__(self) -> int:
        return int(self.item().real if self.dtype.is_complex else self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __complex__(self) -> complex:
        return complex(self.item())

    def __index__(self) -> int:
        if self.dtype.is_floating_point or self.dtype.is_complex or self._data.size != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self.item())

    def type(self, dtype: Any = None) -> Any:  # noqa: A003 - torch's name
        if dtype is None:
            return f"ndist.{'cuda.' if self.is_cuda else ''}{self.dtype._name}"
        return self.to(D.to_dtype(dtype))

    def float(self) -> "Tensor":  # noqa: A003
        return self.to(D.float32)

    def double(self) -> "Tensor":
        return self.to(D.float64)

    def half(self) -> "Tensor":
        return self.to(D.float16)

    def bfloat16(self) -> "Tensor":
        return self.to(D.to_dtype("bfloat16"))

    def int(self) -> "Tensor":  # noqa: A003
        return self.to(D.int32)

    def long(self) -> "Tensor":
        return self.to(D.int64)

    def short(self) -> "Tensor":
        return self.to(D.int16)

    def char(self) -> "Tensor":
        return self.to(D.int8)

    def byte(self) -> "Tensor":
        return self.to(D.uint8)

    def bool(self) -> "Tensor":  # noqa: A003
        return self.to(D.bool)

    def cfloat(self) -> "Tensor":
        return self.to(D.complex64)

    def cdouble(self) -> "Tensor":
        return self.to(D.complex128)

    # ------------------------------------------------------------ interop
    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        arr = self.numpy()
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            if copy is False:
                raise ValueError(f"__array__: converting {self.dtype} to {np.dtype(dtype)} "
                                 f"needs a copy, but copy=False was given")
            return arr.astype(dtype)
        return arr.copy() if copy else arr

    @property
    def __cuda_array_interface__(self) -> dict:
        if type(self._data) is np.ndarray:
            raise AttributeError("Can't get __cuda_array_interface__ on non-CUDA tensor "
                                 "(device='cpu'); use .cuda() first")
        return self._data.__cuda_array_interface__

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None,
                   dl_device: Any = None, copy: Any = None) -> Any:
        kw = {k: v for k, v in (("stream", stream), ("max_version", max_version),
                                ("dl_device", dl_device), ("copy", copy)) if v is not None}
        try:
            return self._data.__dlpack__(**kw)
        except TypeError:
            if not kw.keys() - {"stream"}:
                raise
            # an older array library: only ``stream`` is understood
            return self._data.__dlpack__(**({"stream": stream} if stream is not None else {}))

    def __dlpack_device__(self) -> tuple:
        return self._data.__dlpack_device__()

    def share_memory_(self) -> "Tensor":
        """Move the storage to shared memory (in place) so other processes can map it."""
        from . import _shm  # noqa: PLC0415 - owned by ndist.tensor._shm

        if type(self._data) is not np.ndarray:
            return self  # CUDA storage is shared through CUDA IPC, as in torch
        self._data = _shm.share_array(self._data)
        return self

    def is_shared(self) -> bool:
        from . import _shm  # noqa: PLC0415

        if type(self._data) is not np.ndarray:
            return True
        return bool(_shm.is_shared(self._data))

    def is_pinned(self) -> bool:
        return False

    def __repr__(self) -> str:
        from ._repr import tensor_repr  # noqa: PLC0415

        return tensor_repr(self)

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        if self._data.ndim == 0 and spec:
            return format(self.item(), spec)
        return repr(self)


def _rebuild_tensor(array: Any) -> Tensor:
    return Tensor._wrap(array)
