"""The arrays behind new tensors: the factories' shared arguments (size, dtype,
device, requires_grad), allocation on a device, and arrays from Python data,
NumPy / CuPy arrays and DLPack producers.

Functions of arrays and plain values; they know nothing of ``Tensor``. The
factories (``_factories``) and ``Tensor``'s own constructors (``Tensor(...)``,
``new_*``) wrap what these return, and handle a ``Tensor`` argument themselves
before calling them."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _dtype as D
from ._cuda import note_allocation, require_cupy, resolve
from ._dlpack import array_from_dlpack
from ._shape import ints
from ._transfer import convert, move

__all__ = ["dtype_or_default", "sizes", "dtype_device", "no_grad", "fill_dtype", "alloc",
           "on_device", "array_copy", "array_as"]


def dtype_or_default(dtype: Any, default: D.dtype | None = None) -> D.dtype:
    if dtype is None:
        return D.get_default_dtype() if default is None else default
    return D.to_dtype(dtype)


def sizes(args: tuple, kwargs: dict, name: str) -> tuple[int, ...]:
    """The shape of ``name(*args, size=...)``; ValueError for a negative dimension."""
    if "size" in kwargs:
        if args:
            raise TypeError(f"{name}: size given both positionally and as size=")
        args = (kwargs.pop("size"),)
    shape = ints(args, name)
    for s in shape:
        if s < 0:
            raise ValueError(f"{name}: trying to create tensor with negative dimension {s}: "
                             f"{list(shape)}")
    return shape


def dtype_device(kwargs: dict, name: str) -> tuple[Any, Any]:
    """``dtype`` and ``device`` out of a factory's keywords; TypeError for unknown ones."""
    dtype, device = kwargs.pop("dtype", None), kwargs.pop("device", None)
    no_grad(kwargs.pop("requires_grad", False), name)
    kwargs.pop("pin_memory", None)
    kwargs.pop("layout", None)
    if kwargs:
        raise TypeError(f"{name}: unexpected keyword arguments {sorted(kwargs)}")
    return dtype, device


def no_grad(requires_grad: Any, name: str) -> None:
    if requires_grad:
        raise ValueError(f"{name}: requires_grad=True is not supported (ndist has no autograd); "
                         f"got requires_grad={requires_grad!r}")


def fill_dtype(value: Any) -> D.dtype:
    """The dtype a Python / NumPy scalar fill value gives ``full``."""
    try:
        return D._scalar_dtype(value)
    except TypeError:
        raise TypeError(f"fill_value: expected a number, got {type(value).__name__}") from None


def alloc(kind: str, shape: tuple, dt: D.dtype, device: Any, fill: Any = None) -> Any:
    """A new array from ``numpy.<kind>`` / ``cupy.<kind>`` (empty, zeros, ones, full) on ``device``."""
    dev = resolve(device)
    npdt = dt.numpy_dtype
    if dev.type == "cpu":
        return _alloc(np, kind, shape, npdt, fill)
    xp = require_cupy()
    with xp.cuda.Device(dev.index):
        arr = _alloc(xp, kind, shape, npdt, fill)
    note_allocation(dev.index)
    return arr


def _alloc(xp, kind, shape, npdt, fill):
    if kind == "full":
        return xp.full(shape, fill, dtype=npdt)
    return getattr(xp, kind)(shape, dtype=npdt)


def on_device(arr: np.ndarray, device: Any) -> Any:
    return move(arr, resolve(device))


def array_copy(data: Any, dt: D.dtype | None, device: Any) -> Any:
    """``ndist.tensor(data)``'s array, for any ``data`` but a Tensor: always a new array.

    Python floats become the default dtype, ints int64, bools bool, complex the
    default complex dtype; arrays keep their dtype."""
    np_dt = None if dt is None else dt.numpy_dtype
    if hasattr(data, "__cuda_array_interface__") and not isinstance(data, np.ndarray):
        return convert(require_cupy().asarray(data), device, np_dt, True)
    if hasattr(data, "__dlpack__") and not isinstance(data, (np.ndarray, np.generic)):
        return convert(array_from_dlpack(data), device, np_dt, True)  # torch / JAX tensors
    if isinstance(data, (np.ndarray, np.generic)):
        arr = np.array(data, dtype=np_dt)
        if dt is None:
            D.from_numpy_dtype(arr.dtype, what="data")
    else:
        arr = from_python(data, dt)
    return on_device(arr, device)


def array_as(data: Any, dt: D.dtype | None, device: Any) -> Any:
    """``ndist.as_tensor(data)``'s array, for any ``data`` but a Tensor: ``data``'s own
    array (memory shared) when no conversion is needed."""
    np_dt = None if dt is None else dt.numpy_dtype
    if isinstance(data, np.ndarray) or hasattr(data, "__cuda_array_interface__"):
        arr = data if isinstance(data, np.ndarray) else require_cupy().asarray(data)
        D.from_numpy_dtype(arr.dtype, what="data")
        return convert(arr, device, np_dt, False)
    if hasattr(data, "__dlpack__") and not isinstance(data, (list, tuple)):
        return convert(array_from_dlpack(data), device, np_dt, False)
    return array_copy(data, dt, device)


def from_python(data: Any, dt: D.dtype | None) -> np.ndarray:
    """A NumPy array from numbers / nested sequences, with torch's dtype inference."""
    if isinstance(data, (str, bytes)) or data is None:
        raise TypeError(f"tensor: data must be a number or a (nested) sequence of numbers, "
                        f"got {type(data).__name__}")
    try:
        arr = np.array(data) if dt is None else np.array(data, dtype=dt.numpy_dtype)
    except ValueError as exc:
        raise ValueError(f"tensor: data must be a rectangular nested sequence of numbers ({exc})") from None
    if arr.dtype == object or arr.dtype.kind in "USV" and dt is None:
        raise TypeError(f"tensor: could not infer a numeric dtype from data of type "
                        f"{type(data).__name__} (got NumPy dtype {arr.dtype})")
    if dt is None:
        if arr.dtype.kind == "f":
            arr = arr.astype(D.get_default_dtype().numpy_dtype)
        elif arr.dtype.kind == "c":
            arr = arr.astype(D.get_default_dtype().to_complex().numpy_dtype)
        elif arr.dtype.kind in "iu" and arr.dtype != np.int64:
            arr = arr.astype(np.int64)
        elif arr.size == 0 and arr.dtype.kind != "b":
            arr = arr.astype(D.get_default_dtype().numpy_dtype)
    return arr
