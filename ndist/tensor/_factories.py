"""Tensor factories: tensor / as_tensor / from_numpy / from_dlpack, empty / zeros /
ones / full, arange / linspace, random ones, the ``*_like`` forms, and cat / stack / where.

They sit above ``Tensor``: each builds its array with ``_construct`` (or NumPy /
CuPy directly) and wraps it with ``Tensor._wrap``."""

from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

import numpy as np

from . import _dtype as D
from . import _random as R
from ._construct import alloc, array_as, array_copy, dtype_device, dtype_or_default, fill_dtype, no_grad, on_device, sizes
from ._cuda import resolve
from ._dlpack import array_from_dlpack
from ._operands import check_same_device
from ._shape import ints as _ints, norm_dim
from ._tensor import Tensor

__all__ = [
    "tensor", "as_tensor", "from_numpy", "from_dlpack", "empty", "zeros", "ones", "full", "eye",
    "arange", "linspace", "rand", "randn", "randint", "empty_like", "zeros_like", "ones_like",
    "full_like", "rand_like", "randn_like", "randint_like", "cat", "concat", "concatenate", "stack",
    "where",
]


def _make(kind: str, shape: tuple, dt: D.dtype, device: Any, fill: Any = None) -> Tensor:
    return Tensor._wrap(alloc(kind, shape, dt, device, fill))


def _to_device(arr: np.ndarray, device: Any) -> Tensor:
    return Tensor._wrap(on_device(arr, device))


def empty(*size: Any, **kwargs: Any) -> Tensor:
    """An uninitialised tensor of ``size`` (ints or one sequence)."""
    shape = sizes(size, kwargs, "empty")
    dtype, device = dtype_device(kwargs, "empty")
    return _make("empty", shape, dtype_or_default(dtype), device)


def zeros(*size: Any, **kwargs: Any) -> Tensor:
    shape = sizes(size, kwargs, "zeros")
    dtype, device = dtype_device(kwargs, "zeros")
    return _make("zeros", shape, dtype_or_default(dtype), device)


def ones(*size: Any, **kwargs: Any) -> Tensor:
    shape = sizes(size, kwargs, "ones")
    dtype, device = dtype_device(kwargs, "ones")
    return _make("ones", shape, dtype_or_default(dtype), device)


def full(size: Any, fill_value: Any, **kwargs: Any) -> Tensor:
    """A tensor of ``size`` filled with ``fill_value`` (dtype inferred from it)."""
    shape = sizes((size,), {}, "full")
    dtype, device = dtype_device(kwargs, "full")
    dt = dtype_or_default(dtype, fill_value.dtype if isinstance(fill_value, Tensor) else fill_dtype(fill_value))
    if isinstance(fill_value, Tensor):
        fill_value = fill_value.item()
    return _make("full", shape, dt, device, fill_value)


def eye(n: int, m: int | None = None, **kwargs: Any) -> Tensor:
    dtype, device = dtype_device(kwargs, "eye")
    n, m = _ints((n, n if m is None else m), "eye")
    t = zeros(n, m, dtype=dtype, device=device)
    with t._guard():
        t._xp.fill_diagonal(t._data, 1)
    return t


def tensor(data: Any, *, dtype: Any = None, device: Any = None, requires_grad: bool = False,
           pin_memory: bool = False) -> Tensor:
    """A new tensor holding a copy of ``data`` (nested lists, numbers, arrays, tensors).

    Python floats become the default dtype, ints int64, bools bool, complex the
    default complex dtype; arrays and tensors keep their dtype."""
    no_grad(requires_grad, "tensor")
    dt = None if dtype is None else D.to_dtype(dtype)
    if isinstance(data, Tensor):
        return data._convert(device, dt, True)
    return Tensor._wrap(array_copy(data, dt, device))


def as_tensor(data: Any, dtype: Any = None, device: Any = None) -> Tensor:
    """Like ``tensor`` but shares memory with ``data`` when no conversion is needed."""
    dt = None if dtype is None else D.to_dtype(dtype)
    if isinstance(data, Tensor):
        return data._convert(device, dt, False)
    return Tensor._wrap(array_as(data, dt, device))


def from_numpy(ndarray: np.ndarray) -> Tensor:
    """A CPU tensor sharing memory with ``ndarray``."""
    if not isinstance(ndarray, np.ndarray):
        raise TypeError(f"from_numpy: expected np.ndarray, got {type(ndarray).__name__}")
    if not ndarray.dtype.isnative:
        raise ValueError(f"from_numpy: the array has non-native byte order ({ndarray.dtype.str}); "
                         f"convert it with ndarray.astype(ndarray.dtype.newbyteorder('='))")
    D.from_numpy_dtype(ndarray.dtype, what="from_numpy")
    return Tensor._wrap(ndarray)


def from_dlpack(ext_tensor: Any) -> Tensor:
    """A tensor sharing memory with ``ext_tensor`` (any object with ``__dlpack__``).

    CPU producers are wrapped as NumPy arrays, CUDA producers as CuPy arrays on
    the producer's GPU; nothing is copied."""
    if isinstance(ext_tensor, Tensor):
        return ext_tensor
    return Tensor._wrap(array_from_dlpack(ext_tensor))


def _like(t: Tensor, dtype: Any, device: Any) -> tuple:
    if not isinstance(t, Tensor):
        raise TypeError(f"input: expected an ndist.Tensor, got {type(t).__name__}")
    return (t.shape, t.dtype if dtype is None else D.to_dtype(dtype),
            t.device if device is None else device)


def empty_like(input: Tensor, *, dtype: Any = None, device: Any = None, **kw: Any) -> Tensor:  # noqa: A002
    shape, dt, dev = _like(input, dtype, device)
    return _make("empty", shape, dt, dev)


def zeros_like(input: Tensor, *, dtype: Any = None, device: Any = None, **kw: Any) -> Tensor:  # noqa: A002
    shape, dt, dev = _like(input, dtype, device)
    return _make("zeros", shape, dt, dev)


def ones_like(input: Tensor, *, dtype: Any = None, device: Any = None, **kw: Any) -> Tensor:  # noqa: A002
    shape, dt, dev = _like(input, dtype, device)
    return _make("ones", shape, dt, dev)


def full_like(input: Tensor, fill_value: Any, *, dtype: Any = None, device: Any = None,  # noqa: A002
              **kw: Any) -> Tensor:
    shape, dt, dev = _like(input, dtype, device)
    return _make("full", shape, dt, dev, fill_value)


def rand_like(input: Tensor, *, dtype: Any = None, device: Any = None, **kw: Any) -> Tensor:  # noqa: A002
    shape, dt, dev = _like(input, dtype, device)
    return rand(shape, dtype=dt, device=dev)


def randn_like(input: Tensor, *, dtype: Any = None, device: Any = None, **kw: Any) -> Tensor:  # noqa: A002
    shape, dt, dev = _like(input, dtype, device)
    return randn(shape, dtype=dt, device=dev)


def randint_like(input: Tensor, low: int = 0, high: int | None = None, *, dtype: Any = None,  # noqa: A002
                 device: Any = None) -> Tensor:
    shape, dt, dev = _like(input, dtype, device)
    if high is None:
        low, high = 0, low
    return randint(low, high, shape, dtype=dt, device=dev)


def arange(start: Any, end: Any = None, step: Any = 1, *, dtype: Any = None,
           device: Any = None, **kw: Any) -> Tensor:
    """Values from ``start`` (default 0) up to, not including, ``end`` by ``step``."""
    if end is None:
        start, end = 0, start
    vals = (start, end, step)
    for name, v in zip(("start", "end", "step"), vals):
        if isinstance(v, Tensor):
            v = v.item()
        if not isinstance(v, (numbers.Real, np.generic)):
            raise TypeError(f"arange: {name} must be a real number, got {type(v).__name__}")
    start, end, step = (v.item() if isinstance(v, Tensor) else v for v in vals)
    if step == 0:
        raise ValueError("arange: step must be nonzero")
    if (end - start) * step < 0:
        raise ValueError(f"arange: upper bound and lower bound inconsistent with step sign "
                         f"(start={start}, end={end}, step={step})")
    ints = all(isinstance(v, (numbers.Integral, np.integer)) for v in (start, end, step))
    dt = dtype_or_default(dtype, D.int64 if ints else None)
    n = max(0, math.ceil((end - start) / step))
    arr = (start + np.arange(n, dtype=np.int64) * step) if ints else \
        start + np.arange(n, dtype=np.float64) * step
    return _to_device(arr.astype(dt.numpy_dtype, copy=False), device)


def linspace(start: Any, end: Any, steps: int, *, dtype: Any = None, device: Any = None,
             **kw: Any) -> Tensor:
    if isinstance(steps, bool) or not isinstance(steps, (numbers.Integral, np.integer)):
        raise TypeError(f"linspace: steps must be an int, got {type(steps).__name__}")
    if steps < 0:
        raise ValueError(f"linspace: number of steps must be non-negative, got {steps}")
    dt = dtype_or_default(dtype)
    arr = np.linspace(start, end, steps, dtype=np.complex128 if dt.is_complex else np.float64)
    if dt._category < 2:
        arr = np.trunc(arr)
    return _to_device(arr.astype(dt.numpy_dtype), device)


def _rand_args(size: tuple, kwargs: dict, name: str):
    shape = sizes(size, kwargs, name)
    gen = kwargs.pop("generator", None)
    dtype, device = dtype_device(kwargs, name)
    return shape, dtype_or_default(dtype), resolve(device), gen


def rand(*size: Any, **kwargs: Any) -> Tensor:
    """Uniform samples on [0, 1)."""
    shape, dt, dev, gen = _rand_args(size, kwargs, "rand")
    return Tensor._wrap(R.uniform(shape, dt, dev, gen))


def randn(*size: Any, **kwargs: Any) -> Tensor:
    """Standard normal samples."""
    shape, dt, dev, gen = _rand_args(size, kwargs, "randn")
    return Tensor._wrap(R.normal(shape, dt, dev, gen))


def randint(*args: Any, **kwargs: Any) -> Tensor:
    """``randint(high, size)`` or ``randint(low, high, size)``: ints in [low, high)."""
    size = kwargs.pop("size", None)
    if size is None:
        if not args or not isinstance(args[-1], (tuple, list)):
            raise TypeError("randint: size must be given as a tuple, e.g. randint(10, (2, 3))")
        args, size = args[:-1], args[-1]
    low, high = kwargs.pop("low", None), kwargs.pop("high", None)
    if len(args) == 2:
        low, high = args
    elif len(args) == 1:
        if high is None:
            high = args[0]
        else:
            low = args[0]
    elif args:
        raise TypeError(f"randint: expected (high, size) or (low, high, size), got {len(args) + 1} "
                        f"positional arguments")
    if high is None:
        raise TypeError("randint: missing 'high'")
    shape = sizes((size,), {}, "randint")
    gen = kwargs.pop("generator", None)
    dtype, device = dtype_device(kwargs, "randint")
    dt = dtype_or_default(dtype, D.int64)
    return Tensor._wrap(R.integers(int(low or 0), int(high), shape, dt, resolve(device), gen))


# ---------------------------------------------------------------- joining
def _tensors(tensors: Any, name: str) -> list[Tensor]:
    if isinstance(tensors, Tensor) or not isinstance(tensors, Sequence):
        raise TypeError(f"{name}: tensors must be a list or tuple of tensors, got "
                        f"{type(tensors).__name__}")
    ts = list(tensors)
    if not ts:
        raise ValueError(f"{name}: expected a non-empty list of tensors")
    for i, t in enumerate(ts):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a list of tensors, but element {i} is "
                            f"{type(t).__name__}")
        check_same_device(name, ts[0]._data, t._data, allow_cpu_scalar=False)
    return ts


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Concatenate along an existing ``dim`` (dtypes promote, devices must match)."""
    ts = _tensors(tensors, "cat")
    # torch skips legacy 1-D empty tensors when others have more dimensions
    full_ts = [t for t in ts if not (t._data.ndim == 1 and t._data.shape[0] == 0)] or ts[:1]
    ref = full_ts[0]
    if ref._data.ndim == 0:
        raise ValueError("cat: zero-dimensional tensor (at position 0) cannot be concatenated")
    d = norm_dim(dim, ref._data.ndim)
    for i, t in enumerate(full_ts):
        a, b = ref._data.shape, t._data.shape
        if len(a) != len(b) or any(x != y for j, (x, y) in enumerate(zip(a, b)) if j != d):
            raise ValueError(f"cat: sizes of tensors must match except in dimension {d}; "
                             f"got {list(a)} for the first tensor and {list(b)} for tensor {i}")
    rt = D.result_type(*full_ts) if len(full_ts) > 1 else ref.dtype
    arrs = [t._data if t.dtype is rt else t._data.astype(rt.numpy_dtype) for t in full_ts]
    with ref._guard():
        return Tensor._wrap(ref._xp.concatenate(arrs, axis=d))


concat = concatenate = cat


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Join equally shaped tensors along a new ``dim``."""
    ts = _tensors(tensors, "stack")
    d = norm_dim(dim, ts[0]._data.ndim, extra=1)
    for i, t in enumerate(ts):
        if t._data.shape != ts[0]._data.shape:
            raise ValueError(f"stack expects each tensor to be equal size, but got "
                             f"{list(ts[0]._data.shape)} at entry 0 and {list(t._data.shape)} "
                             f"at entry {i}")
    rt = D.result_type(*ts) if len(ts) > 1 else ts[0].dtype
    arrs = [t._data if t.dtype is rt else t._data.astype(rt.numpy_dtype) for t in ts]
    with ts[0]._guard():
        return Tensor._wrap(ts[0]._xp.stack(arrs, axis=d))


def where(condition: Tensor, input: Any, other: Any) -> Tensor:  # noqa: A002 - torch's names
    """Elements of ``input`` where ``condition`` holds, else of ``other``."""
    if not isinstance(condition, Tensor):
        raise TypeError(f"where: condition must be a tensor, got {type(condition).__name__}")
    if condition.dtype is not D.bool:
        raise TypeError(f"where: condition must be a bool tensor, got {condition.dtype}")
    operands = [x for x in (input, other)]
    for x in operands:
        if isinstance(x, Tensor):
            check_same_device("where", condition._data, x._data)
    rt = D.result_type(*operands)
    xp = condition._xp
    arrs = [x._data.astype(rt.numpy_dtype, copy=False) if isinstance(x, Tensor)
            else np.asarray(x).astype(rt.numpy_dtype)[()] for x in operands]
    with condition._guard():
        return Tensor._wrap(xp.asarray(xp.where(condition._data, *arrs)))

