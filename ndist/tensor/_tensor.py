"""``ndist.Tensor``: a thin, torch-like wrapper over one NumPy or CuPy array.

``t._data`` is the array (any strides), the only state a tensor has; views share
it, and ``Tensor._wrap`` wraps an array without copying. The class is the one
place that holds a ``Tensor``: every module it imports works on arrays, dtypes and
plain values and knows nothing of it (shape arguments: ``_shape``; operands and
the same-device rule: ``_operands``; new arrays: ``_construct``; moves and casts
across devices: ``_transfer``; repr: ``_repr``). The factories (``_factories``)
sit above it.
"""

from __future__ import annotations

import collections
import contextlib
import numbers
import sys
from typing import Any

import numpy as np

from . import _dtype as D
from ._construct import alloc, array_as, array_copy, dtype_device, dtype_or_default, fill_dtype, no_grad, sizes
from ._device import CPU, device
from ._operands import SCALARS, cast_scalar, check_same_device, is_shape_error, to_operand_array
from ._repr import tensor_repr
from ._shape import axes, ints, norm_dim
from ._transfer import convert, copy_into, move

__all__ = ["Tensor", "Size", "is_tensor", "max_result", "min_result"]

_IGNORE = {"all": "ignore"}
_NULL = contextlib.nullcontext()


def _result_type(name: str):
    base = collections.namedtuple(name, ["values", "indices"])

    def __repr__(self) -> str:  # torch's layout: one field per line
        return f"ndist.return_types.{name}(\nvalues={self.values!r},\nindices={self.indices!r})"

    cls = type(name, (base,), {"__slots__": (), "__repr__": __repr__})
    cls.__module__ = "ndist.return_types"
    return cls


#: what ``max`` / ``min`` with a dim return (torch's ``return_types``): ``(values, indices)``
max_result = _result_type("max")
min_result = _result_type("min")


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


class Tensor:
    """A multi-dimensional array on the CPU (NumPy) or a CUDA GPU (CuPy)."""

    __array_priority__ = 1000  # ndarray (op) Tensor defers to Tensor's reflected op
    _data: Any

    def __new__(cls, *args: Any, **kwargs: Any):
        # Legacy torch.Tensor(...) constructor: Tensor([1, 2]) (a copy, in the default
        # float dtype) or Tensor(2, 3) (uninitialised, float).
        if len(args) == 1 and not isinstance(args[0], (numbers.Integral, tuple)):
            return cls._legacy_copy(args[0], **kwargs)
        shape = sizes(args or (0,), kwargs, "empty")
        dtype, dev = dtype_device(kwargs, "empty")
        return cls._wrap(alloc("empty", shape, dtype_or_default(dtype), dev))

    @classmethod
    def _legacy_copy(cls, data: Any, *, device: Any = None, requires_grad: bool = False,  # noqa: A002
                     pin_memory: bool = False) -> "Tensor":
        no_grad(requires_grad, "tensor")
        dt = D.get_default_dtype()
        if isinstance(data, Tensor):
            return data._convert(device, dt, True)
        return cls._wrap(array_copy(data, dt, device))

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

    @property
    def _xp(self):
        """The array library of this tensor: numpy, or cupy (already imported: it made ``_data``)."""
        return np if type(self._data) is np.ndarray else sys.modules["cupy"]

    def _guard(self):
        """Context that makes this tensor's GPU current (CuPy allocates on the current one)."""
        arr = self._data
        return _NULL if type(arr) is np.ndarray else arr.device

    # ------------------------------------------------------------ metadata
    @property
    def shape(self) -> Size:
        return Size(self._data.shape)

    def size(self, dim: int | None = None):
        if dim is None:
            return Size(self._data.shape)
        return self._data.shape[norm_dim(dim, self._data.ndim)]

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
        return st if dim is None else st[norm_dim(dim, self._data.ndim)]

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
            check_same_device("__setitem__", arr, value._data, allow_cpu_scalar=True)
            value = value._data
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
    def _new(self, kind: str, shape: tuple, dtype: Any, dev: Any, fill: Any = None) -> "Tensor":
        return Tensor._wrap(alloc(kind, shape, D.to_dtype(dtype or self.dtype), dev or self.device, fill))

    def new_empty(self, *size: Any, dtype: Any = None, device: Any = None) -> "Tensor":
        """An uninitialised tensor with this tensor's dtype and device by default."""
        return self._new("empty", sizes(size, {}, "empty"), dtype, device)

    def new_zeros(self, *size: Any, dtype: Any = None, device: Any = None) -> "Tensor":
        return self._new("zeros", sizes(size, {}, "zeros"), dtype, device)

    def new_ones(self, *size: Any, dtype: Any = None, device: Any = None) -> "Tensor":
        return self._new("ones", sizes(size, {}, "ones"), dtype, device)

    def new_full(self, size: Any, fill_value: Any, *, dtype: Any = None,
                 device: Any = None) -> "Tensor":
        shape = sizes((size,), {}, "full")
        if isinstance(fill_value, Tensor):
            fill_value = fill_value.item()
        else:
            fill_dtype(fill_value)  # TypeError for a fill value that is not a number
        return self._new("full", shape, dtype, device, fill_value)

    def new_tensor(self, data: Any, *, dtype: Any = None, device: Any = None) -> "Tensor":
        dt, dev = D.to_dtype(dtype or self.dtype), device or self.device
        if isinstance(data, Tensor):
            return data._convert(dev, dt, True)
        return Tensor._wrap(array_copy(data, dt, dev))

    # ------------------------------------------------------------ shape and views
    # Every result but reshape's unavoidable copy shares this tensor's storage.
    def contiguous(self) -> "Tensor":
        if self._data.flags.c_contiguous:
            return self
        with self._guard():  # CuPy allocates on the *current* GPU: make it the array's
            return self._wrap(self._xp.ascontiguousarray(self._data))

    def reshape(self, *shape: Any) -> "Tensor":
        shape = ints(shape, "reshape")
        try:
            with self._guard():  # may copy
                return self._wrap(self._data.reshape(shape))
        except ValueError:
            raise ValueError(f"reshape: shape {list(shape)} is invalid for input of size "
                             f"{self.numel()} (shape {list(self.shape)})") from None

    def reshape_as(self, other: "Tensor") -> "Tensor":
        return self.reshape(other.shape)

    def view(self, *shape: Any) -> "Tensor":
        """A view with a new shape (never a copy), or a reinterpretation as another dtype."""
        if len(shape) == 1 and not isinstance(shape[0], (tuple, list, numbers.Integral)):
            dt = D.to_dtype(shape[0], arg="view")
            return self._wrap(self._data.view(dt.numpy_dtype))
        out = self.reshape(*shape)
        # reshape copies only when it must; a copy lives at a new address.
        if out.numel() and out.data_ptr() != self.data_ptr():
            raise ValueError(f"view: size {list(out.shape)} is not compatible with the input's "
                             f"size {list(self.shape)} and stride {list(self.stride())} "
                             f"(at least one dimension spans across two contiguous subspaces); "
                             f"use .reshape(...) instead")
        return out

    def view_as(self, other: "Tensor") -> "Tensor":
        return self.view(other.shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> "Tensor":
        n = self._data.ndim
        if n == 0:
            return self.reshape(1)
        s, e = norm_dim(start_dim, n, "start_dim"), norm_dim(end_dim, n, "end_dim")
        if s > e:
            raise ValueError(f"flatten: start_dim ({start_dim}) must not come after end_dim ({end_dim})")
        shp = self._data.shape
        return self.reshape(shp[:s] + (-1 if self.numel() else int(np.prod(shp[s:e + 1])),) + shp[e + 1:])

    def unflatten(self, dim: int, sizes: Any) -> "Tensor":
        d = norm_dim(dim, self._data.ndim)
        shp = self._data.shape
        return self.reshape(shp[:d] + ints((sizes,), "sizes") + shp[d + 1:])

    def permute(self, *dims: Any) -> "Tensor":
        dims = ints(dims, "permute")
        n = self._data.ndim
        if len(dims) != n:
            raise ValueError(f"permute: dims has {len(dims)} entries {list(dims)} but the tensor "
                             f"has {n} dimensions")
        norm = [norm_dim(d, n, "dims") for d in dims]
        if len(set(norm)) != n:
            raise ValueError(f"permute: dims {list(dims)} repeat a dimension")
        return self._wrap(self._data.transpose(norm))

    def transpose(self, dim0: int, dim1: int) -> "Tensor":
        n = self._data.ndim
        if n == 0:
            return self
        return self._wrap(self._xp.swapaxes(self._data, norm_dim(dim0, n, "dim0"), norm_dim(dim1, n, "dim1")))

    swapaxes = transpose

    def t(self) -> "Tensor":
        if self._data.ndim > 2:
            raise ValueError(f"t() expects a tensor with <= 2 dimensions, but self is {self._data.ndim}D")
        return self._wrap(self._data.T)

    @property
    def T(self) -> "Tensor":  # noqa: N802 - torch's name
        return self._wrap(self._data.T)

    @property
    def mT(self) -> "Tensor":  # noqa: N802 - torch's name
        if self._data.ndim < 2:
            raise ValueError(f"mT: tensor must have at least 2 dimensions, got {self._data.ndim}")
        return self._wrap(self._xp.swapaxes(self._data, -1, -2))

    def squeeze(self, dim: Any = None) -> "Tensor":
        arr = self._data
        if dim is None:
            return self._wrap(arr.reshape(tuple(s for s in arr.shape if s != 1)))
        dims = dim if isinstance(dim, (tuple, list)) else (dim,)
        keep = {norm_dim(d, arr.ndim) for d in dims if arr.ndim and arr.shape[norm_dim(d, arr.ndim)] == 1}
        return self._wrap(arr.reshape(tuple(s for i, s in enumerate(arr.shape) if i not in keep)))

    def unsqueeze(self, dim: int) -> "Tensor":
        d = norm_dim(dim, self._data.ndim, extra=1)
        shp = self._data.shape
        return self._wrap(self._data.reshape(shp[:d] + (1,) + shp[d:]))

    def expand(self, *sizes: Any) -> "Tensor":
        """A view with size-1 dims repeated (stride 0); -1 keeps a dim's size."""
        sizes = ints(sizes, "expand")
        arr = self._data
        if len(sizes) < arr.ndim:
            raise ValueError(f"expand: the number of sizes provided ({len(sizes)}) must be greater "
                             f"or equal to the number of dimensions in the tensor ({arr.ndim})")
        lead = len(sizes) - arr.ndim
        shape, strides = [], []
        for i, want in enumerate(sizes):
            have = arr.shape[i - lead] if i >= lead else 1
            stride = arr.strides[i - lead] if i >= lead else 0
            if want == -1:
                if i < lead:
                    raise ValueError(f"expand: -1 is not allowed for the new leading dim {i}")
                want = have
            if want != have:
                if have != 1:
                    raise ValueError(f"expand: the expanded size of the tensor ({want}) must match "
                                     f"the existing size ({have}) at non-singleton dimension {i}; "
                                     f"target sizes {list(sizes)}, tensor shape {list(arr.shape)}")
                stride = 0
            shape.append(want)
            strides.append(stride)
        return self._wrap(self._xp.lib.stride_tricks.as_strided(arr, tuple(shape), tuple(strides)))

    def expand_as(self, other: "Tensor") -> "Tensor":
        return self.expand(other.shape)

    def narrow(self, dim: int, start: int, length: int) -> "Tensor":
        d = norm_dim(dim, self._data.ndim)
        n = self._data.shape[d]
        start = start + n if start < 0 else start
        if not (0 <= start <= n and 0 <= length and start + length <= n):
            raise ValueError(f"narrow: start ({start}) + length ({length}) exceeds dimension "
                             f"size ({n}) of dim {dim}")
        idx = (slice(None),) * d + (slice(start, start + length),)
        return self._wrap(self._data[idx])

    def chunk(self, chunks: int, dim: int = 0) -> tuple["Tensor", ...]:
        """Split into ``chunks`` views of ceil(n / chunks) (the last may be smaller, and
        fewer may come back, as in torch)."""
        if isinstance(chunks, bool) or not isinstance(chunks, (numbers.Integral, np.integer)):
            raise TypeError(f"chunk: chunks must be an int, got {type(chunks).__name__}")
        if chunks <= 0:
            raise ValueError(f"chunk: chunks must be greater than 0, got {chunks}")
        d = norm_dim(dim, self._data.ndim)
        n = self._data.shape[d]
        step = max(-(-n // chunks), 1)
        return self.split(step, d) if n else tuple(self.split(0, d)) * chunks

    def split(self, split_size_or_sections: Any, dim: int = 0) -> tuple["Tensor", ...]:
        """Views of ``split_size`` along ``dim`` (int), or of the given sizes (list)."""
        if self._data.ndim == 0:
            raise ValueError("split: cannot split a 0-d tensor")
        d = norm_dim(dim, self._data.ndim)
        n = self._data.shape[d]
        arg = split_size_or_sections
        if isinstance(arg, (numbers.Integral, np.integer)) and not isinstance(arg, bool):
            if arg < 0 or (arg == 0 and n):
                raise ValueError(f"split: split_size must be a positive int, got {arg}")
            sizes = [arg] * (n // arg) + ([n % arg] if n % arg else []) if arg else [0]
        elif isinstance(arg, (list, tuple)):
            sizes = list(ints((list(arg),), "split_size_or_sections"))
            if any(s < 0 for s in sizes) or sum(sizes) != n:
                raise ValueError(f"split: split_size_or_sections {sizes} must be non-negative and "
                                 f"sum to the length of dim {dim}; they sum to {sum(sizes)} but "
                                 f"the length is {n} (shape {list(self.shape)})")
        else:
            raise TypeError(f"split: split_size_or_sections must be an int or a list of ints, "
                            f"got {type(arg).__name__}")
        out, start, pre = [], 0, (slice(None),) * d
        for s in sizes:
            out.append(self._wrap(self._data[pre + (slice(start, start + s),)]))
            start += s
        return tuple(out)

    def tensor_split(self, sections: int, dim: int = 0) -> tuple["Tensor", ...]:
        d = norm_dim(dim, self._data.ndim)
        n = self._data.shape[d]
        q, r = divmod(n, sections)
        return self.split([q + 1] * r + [q] * (sections - r), d)

    def unbind(self, dim: int = 0) -> tuple["Tensor", ...]:
        d = norm_dim(dim, self._data.ndim)
        pre = (slice(None),) * d
        return tuple(self._wrap(self._data[pre + (i, Ellipsis)])
                     for i in range(self._data.shape[d]))

    # ------------------------------------------------------------ elementwise ops
    # Each is one NumPy / CuPy call on the whole array (no per-element Python); on top
    # come torch's type promotion, the same-device check and torch's error behaviour
    # (no warnings for inf / nan results).
    def _prep(self, other: Any, op: str, kind: str):
        """(a, b, result dtype) with ``a`` and ``b`` ready for one ufunc call, or None
        when ``other`` is not an operand this op understands (-> NotImplemented)."""
        a = self._data
        if isinstance(other, Tensor):
            check_same_device(op, a, other._data)
            b = other._data
            da, db = self.dtype, other.dtype
            rt = da if da is db else D.result_type(self, other)
            if type(b) is not type(a):  # 0-d CPU tensor with a CUDA tensor
                b = b.item()
        elif isinstance(other, SCALARS):
            rt = D.result_type(self, other)
            b = other
        elif isinstance(other, (np.ndarray, list, tuple)) or hasattr(other, "__cuda_array_interface__"):
            return self._prep(Tensor._wrap(array_as(other, None, self.device)), op, kind)
        else:
            return None
        if kind == "div" and rt._category < 2:
            rt = D.get_default_dtype()
        elif kind == "bit" and rt._category > 1:
            raise TypeError(f"{op}: bitwise operations need integer or bool tensors, got "
                            f"{self.dtype} and {getattr(other, 'dtype', type(other).__name__)}")
        elif kind in ("floordiv", "mod") and rt.is_complex:
            raise TypeError(f"{op}: not supported for complex tensors ({rt})")
        np_rt = rt.numpy_dtype
        if a.dtype != np_rt:
            a = a.astype(np_rt)
        if isinstance(b, SCALARS):
            b = cast_scalar(b, rt)
        elif b.dtype != np_rt:
            b = b.astype(np_rt)
        if kind in ("floordiv", "mod") and rt._category < 2 and not (b != 0).all():
            raise ZeroDivisionError(f"{op}: integer division by zero")
        return a, b, rt

    def _fast(self, other: Any, kind: str) -> Any:
        """The operand for one direct NumPy call when no promotion or check is needed
        (same-dtype CPU tensors, or a float tensor with a Python int/float), else None."""
        a = self._data
        if type(a) is not np.ndarray:
            return None
        k = a.dtype.kind
        if isinstance(other, Tensor):
            b = other._data
            if type(b) is not np.ndarray or b.dtype != a.dtype:
                return None
            if kind in ("arith", "cmp") or (kind == "div" and k in "fc") or (kind == "bit" and k in "biu"):
                return b
            return None
        if type(other) in (float, int) and k in "fc" and kind in ("arith", "div", "cmp"):
            return other
        return None

    def _binary(self, other: Any, fname: str, kind: str = "arith", reverse: bool = False):
        b = self._fast(other, kind)
        if b is not None:
            a = self._data
            ufunc = getattr(np, fname)
            try:
                if a.dtype.kind in "fc":
                    with np.errstate(**_IGNORE):
                        out = ufunc(b, a) if reverse else ufunc(a, b)
                else:
                    out = ufunc(b, a) if reverse else ufunc(a, b)
            except ValueError:
                pass  # fall through to the general path for its error message
            else:
                return self._wrap(np.asarray(out) if isinstance(out, np.generic) else out)
        if isinstance(other, Tensor) and type(self._data) is np.ndarray \
                and self._data.ndim == 0 and type(other._data) is not np.ndarray:
            # a 0-d CPU tensor meets a CUDA tensor: compute on the GPU, as torch does
            return other._binary(self, fname, kind, reverse=not reverse)
        with self._guard():  # casts in _prep allocate too: on the tensor's own GPU
            prep = self._prep(other, fname, kind)
        if prep is None:
            return NotImplemented
        a, b, _ = prep
        if reverse:
            a, b = b, a
        ufunc = getattr(self._xp, fname)
        try:
            with np.errstate(**_IGNORE), self._guard():
                out = ufunc(a, b)
        except ValueError as exc:
            if not is_shape_error(exc):
                raise ValueError(f"{fname}: {exc}") from None
            what = "are not compatible" if fname == "matmul" else "are not broadcastable"
            raise ValueError(f"{fname}: shapes {list(np.shape(a))} and {list(np.shape(b))} "
                             f"{what} ({exc})") from None
        return self._wrap(np.asarray(out) if isinstance(out, np.generic) else out)

    def _inplace(self, other: Any, fname: str, kind: str = "arith"):
        b = self._fast(other, kind)
        if b is not None and kind != "cmp":
            a = self._data
            try:
                with np.errstate(**_IGNORE):
                    getattr(np, fname)(a, b, out=a)
            except ValueError:
                pass  # general path below reports it
            else:
                return self
        with self._guard():
            prep = self._prep(other, fname + "_", kind)
        if prep is None:
            return NotImplemented
        a, b, rt = prep
        if not D.can_cast(rt, self.dtype):
            raise TypeError(f"{fname}_: result type {rt} can't be cast to the desired output "
                            f"type {self.dtype}")
        try:
            with np.errstate(**_IGNORE), self._guard():
                getattr(self._xp, fname)(a, b, out=self._data, casting="unsafe")
        except ValueError as exc:
            if not is_shape_error(exc):
                raise ValueError(f"{fname}_: {exc}") from None
            raise ValueError(f"{fname}_: the result of broadcasting shapes {list(np.shape(a))} and "
                             f"{list(np.shape(b))} does not fit the output shape "
                             f"{list(self._data.shape)} ({exc})") from None
        return self

    # arithmetic ------------------------------------------------------
    def __add__(self, o): return self._binary(o, "add")
    def __radd__(self, o): return self._binary(o, "add", reverse=True)
    def __iadd__(self, o): return self._inplace(o, "add")
    def __sub__(self, o): return self._binary(o, "subtract")
    def __rsub__(self, o): return self._binary(o, "subtract", reverse=True)
    def __isub__(self, o): return self._inplace(o, "subtract")
    def __mul__(self, o): return self._binary(o, "multiply")
    def __rmul__(self, o): return self._binary(o, "multiply", reverse=True)
    def __imul__(self, o): return self._inplace(o, "multiply")
    def __truediv__(self, o): return self._binary(o, "true_divide", "div")
    def __rtruediv__(self, o): return self._binary(o, "true_divide", "div", reverse=True)
    def __itruediv__(self, o): return self._inplace(o, "true_divide", "div")
    def __floordiv__(self, o): return self._binary(o, "floor_divide", "floordiv")
    def __rfloordiv__(self, o): return self._binary(o, "floor_divide", "floordiv", reverse=True)
    def __ifloordiv__(self, o): return self._inplace(o, "floor_divide", "floordiv")
    def __mod__(self, o): return self._binary(o, "remainder", "mod")
    def __rmod__(self, o): return self._binary(o, "remainder", "mod", reverse=True)
    def __imod__(self, o): return self._inplace(o, "remainder", "mod")
    def __pow__(self, o): return self._binary(o, "power")
    def __rpow__(self, o): return self._binary(o, "power", reverse=True)
    def __ipow__(self, o): return self._inplace(o, "power")
    def __and__(self, o): return self._binary(o, "bitwise_and", "bit")
    def __rand__(self, o): return self._binary(o, "bitwise_and", "bit", reverse=True)
    def __iand__(self, o): return self._inplace(o, "bitwise_and", "bit")
    def __or__(self, o): return self._binary(o, "bitwise_or", "bit")
    def __ror__(self, o): return self._binary(o, "bitwise_or", "bit", reverse=True)
    def __ior__(self, o): return self._inplace(o, "bitwise_or", "bit")
    def __xor__(self, o): return self._binary(o, "bitwise_xor", "bit")
    def __rxor__(self, o): return self._binary(o, "bitwise_xor", "bit", reverse=True)
    def __ixor__(self, o): return self._inplace(o, "bitwise_xor", "bit")
    def __lshift__(self, o): return self._binary(o, "left_shift", "bit")
    def __rshift__(self, o): return self._binary(o, "right_shift", "bit")

    def __matmul__(self, o):
        if not isinstance(o, Tensor):
            return NotImplemented
        if self._data.ndim == 0 or o._data.ndim == 0:
            raise ValueError(f"matmul: both arguments need at least 1 dimension, got shapes "
                             f"{list(self._data.shape)} and {list(o._data.shape)}")
        return self._binary(o, "matmul")

    def __rmatmul__(self, o):
        if isinstance(o, (np.ndarray, list)):
            return Tensor._wrap(array_as(o, None, self.device)) @ self
        return NotImplemented

    # comparisons -----------------------------------------------------
    def __eq__(self, o): return self._binary(o, "equal", "cmp")  # noqa: E704
    def __ne__(self, o): return self._binary(o, "not_equal", "cmp")  # noqa: E704
    def __lt__(self, o): return self._binary(o, "less", "cmp")  # noqa: E704
    def __le__(self, o): return self._binary(o, "less_equal", "cmp")  # noqa: E704
    def __gt__(self, o): return self._binary(o, "greater", "cmp")  # noqa: E704
    def __ge__(self, o): return self._binary(o, "greater_equal", "cmp")  # noqa: E704

    # named forms -----------------------------------------------------
    def add(self, other, *, alpha=1):
        return self + (other * alpha if alpha != 1 else other)

    def sub(self, other, *, alpha=1):
        return self - (other * alpha if alpha != 1 else other)

    def add_(self, other, *, alpha=1):
        return self._inplace(other * alpha if alpha != 1 else other, "add")

    def sub_(self, other, *, alpha=1):
        return self._inplace(other * alpha if alpha != 1 else other, "subtract")

    def div(self, other, *, rounding_mode=None):
        if rounding_mode is None:
            return self / other
        if rounding_mode == "floor":
            return self // other
        if rounding_mode == "trunc":
            q = self._binary(other, "true_divide", "div")
            rt = D.result_type(self, other)
            with q._guard():
                out = q._xp.trunc(q._data)
                return self._wrap(out.astype(rt.numpy_dtype) if rt._category < 2 else out)
        raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")

    def div_(self, other):
        return self._inplace(other, "true_divide", "div")

    def mul_(self, other):
        return self._inplace(other, "multiply")

    def pow_(self, other):
        return self._inplace(other, "power")

    mul = multiply = __mul__
    true_divide = divide = __truediv__
    floor_divide = __floordiv__
    remainder = __mod__
    pow = __pow__  # noqa: A003
    matmul = __matmul__
    subtract = sub
    bitwise_and = __and__
    bitwise_or = __or__
    bitwise_xor = __xor__
    eq, ne, lt, le, gt, ge = __eq__, __ne__, __lt__, __le__, __gt__, __ge__
    greater, less, greater_equal, less_equal, not_equal = gt, lt, ge, le, ne

    def fmod(self, other):
        return self._binary(other, "fmod", "mod")

    def maximum(self, other):
        return self._binary(other, "maximum")

    def minimum(self, other):
        return self._binary(other, "minimum")

    def logical_and(self, other):
        return self._binary(other, "logical_and", "cmp")

    def logical_or(self, other):
        return self._binary(other, "logical_or", "cmp")

    def logical_xor(self, other):
        return self._binary(other, "logical_xor", "cmp")

    def logical_not(self):
        return self._unary("logical_not")

    # unary -----------------------------------------------------------
    def _unary(self, fname: str, float_only: bool = False):
        arr = self._data
        if float_only and arr.dtype.kind in "biu":
            arr = arr.astype(D.get_default_dtype().numpy_dtype)
        with np.errstate(**_IGNORE), self._guard():
            out = getattr(self._xp, fname)(arr)
        return self._wrap(np.asarray(out) if isinstance(out, np.generic) else out)

    def __neg__(self):
        if self.dtype is D.bool:
            raise TypeError("neg: negation, the `-` operator, on a bool tensor is not supported; "
                            "use ~ or logical_not() instead")
        return self._unary("negative")

    def __pos__(self):
        return self

    def __abs__(self):
        return self._unary("absolute")

    def __invert__(self):
        if self.dtype._category > 1:
            raise TypeError(f"bitwise_not: ~ needs an integer or bool tensor, got {self.dtype}")
        return self._unary("invert")

    neg = negative = __neg__
    abs = absolute = __abs__  # noqa: A003
    bitwise_not = __invert__

    def neg_(self):
        return self._inplace_unary("negative")

    def abs_(self):
        return self._inplace_unary("absolute")

    def _inplace_unary(self, fname):
        with np.errstate(**_IGNORE), self._guard():
            getattr(self._xp, fname)(self._data, out=self._data)
        return self

    def sqrt(self): return self._unary("sqrt", True)  # noqa: E704
    def exp(self): return self._unary("exp", True)  # noqa: E704
    def log(self): return self._unary("log", True)  # noqa: E704
    def log2(self): return self._unary("log2", True)  # noqa: E704
    def log10(self): return self._unary("log10", True)  # noqa: E704
    def sin(self): return self._unary("sin", True)  # noqa: E704
    def cos(self): return self._unary("cos", True)  # noqa: E704
    def tan(self): return self._unary("tan", True)  # noqa: E704
    def tanh(self): return self._unary("tanh", True)  # noqa: E704
    def floor(self): return self._unary("floor") if self.dtype._category > 1 else self.clone()  # noqa: E704
    def ceil(self): return self._unary("ceil") if self.dtype._category > 1 else self.clone()  # noqa: E704
    def trunc(self): return self._unary("trunc") if self.dtype._category > 1 else self.clone()  # noqa: E704
    def round(self): return self._unary("rint") if self.dtype._category > 1 else self.clone()  # noqa: E704
    def sign(self): return self._unary("sign")  # noqa: E704
    def square(self): return self * self  # noqa: E704
    def reciprocal(self): return 1.0 / self if self.dtype._category < 2 else 1 / self  # noqa: E704

    def sigmoid(self):
        return 1.0 / (1.0 + (-self.to(D.get_default_dtype()) if self.dtype._category < 2 else -self).exp())

    def isnan(self): return self._unary("isnan")  # noqa: E704
    def isinf(self): return self._unary("isinf")  # noqa: E704
    def isfinite(self): return self._unary("isfinite")  # noqa: E704

    def clamp(self, min=None, max=None):  # noqa: A002 - torch's names
        if min is None and max is None:
            raise ValueError("clamp: at least one of 'min' or 'max' must not be None")
        out = self
        if min is not None:
            out = out.maximum(min)
        if max is not None:
            out = out.minimum(max)
        return out

    clip = clamp

    def clamp_(self, min=None, max=None):  # noqa: A002
        return self.copy_(self.clamp(min, max))

    def flip(self, *dims):
        """A copy with the order of elements along ``dims`` reversed."""
        dims = tuple(norm_dim(d, self._data.ndim) for d in (
            dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims))
        with self._guard():
            return self._wrap(self._xp.flip(self._data, dims).copy())

    # whole-tensor state -------------------------------------------------
    def clone(self):
        with self._guard():
            return self._wrap(self._data.copy())

    def copy_(self, src, non_blocking: bool = False):
        """Copy ``src`` (broadcast, cast; any device) into this tensor, in place."""
        if isinstance(src, Tensor):
            copy_into(self._data, src._data)
        elif isinstance(src, SCALARS):
            self.fill_(src)
        else:
            copy_into(self._data, np.asarray(src))
        return self

    def fill_(self, value):
        if isinstance(value, Tensor):
            if value._data.ndim:
                raise ValueError(f"fill_: only supports a 0-dimension value tensor, got one with "
                                 f"{value._data.ndim} dimensions")
            value = value.item()
        if not isinstance(value, SCALARS):
            raise TypeError(f"fill_: value must be a number, got {type(value).__name__}")
        with self._guard():
            self._data.fill(value)
        return self

    def zero_(self):
        return self.fill_(0)

    # comparisons of whole tensors ---------------------------------------
    def equal(self, other) -> bool:
        """True if ``other`` has the same shape and the same elements."""
        if not isinstance(other, Tensor):
            raise TypeError(f"equal: other must be a tensor, got {type(other).__name__}")
        check_same_device("equal", self._data, other._data, allow_cpu_scalar=False)
        if self._data.shape != other._data.shape:
            return False
        return bool((self == other).all().item())

    def isclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
        if isinstance(other, Tensor):
            check_same_device("isclose", self._data, other._data)
            other = other._data
        with np.errstate(**_IGNORE), self._guard():
            out = self._xp.isclose(self._data, other, rtol=rtol, atol=atol, equal_nan=equal_nan)
        return self._wrap(out)

    def allclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False) -> bool:
        return bool(self.isclose(other, rtol, atol, equal_nan).all().item())

    # ------------------------------------------------------------ reductions
    def _reduce(self, fname, dim, keepdim, dtype=None):
        arr = self._data
        if dim is None and not keepdim and type(arr) is np.ndarray:  # the common case, lean
            with np.errstate(**_IGNORE):
                out = getattr(arr, fname)() if dtype is None else getattr(arr, fname)(dtype=dtype)
            return self._wrap(np.asarray(out))
        kw = {"axis": axes(dim, arr.ndim), "keepdims": bool(keepdim)}
        if dtype is not None:
            kw["dtype"] = dtype
        with np.errstate(**_IGNORE), self._guard():
            out = getattr(arr, fname)(**kw)
        return self._wrap(np.asarray(out) if isinstance(out, np.generic) else out)

    def _acc(self, dtype):
        if dtype is not None:
            return D.to_dtype(dtype).numpy_dtype
        return np.int64 if self._data.dtype.kind in "biu" else None

    def _half_reduce(self, fname, dim, keepdim, dtype):
        # float16 / bfloat16 accumulate in float32 and return their own type, like torch.
        if dtype is None and self._data.dtype.itemsize == 2 and self._data.dtype.kind in "fV":
            out = self._reduce(fname, dim, keepdim, np.float32)
            return self._wrap(out._data.astype(self._data.dtype))
        return None

    def sum(self, dim=None, keepdim=False, *, dtype=None):  # noqa: A003
        half = self._half_reduce("sum", dim, keepdim, dtype)
        return half if half is not None else self._reduce("sum", dim, keepdim, self._acc(dtype))

    def prod(self, dim=None, keepdim=False, *, dtype=None):
        half = self._half_reduce("prod", dim, keepdim, dtype)
        return half if half is not None else self._reduce("prod", dim, keepdim, self._acc(dtype))

    def mean(self, dim=None, keepdim=False, *, dtype=None):
        dt = self.dtype if dtype is None else D.to_dtype(dtype)
        if dt._category < 2:
            raise TypeError(f"mean(): could not infer output dtype. Input dtype must be either a "
                            f"floating point or complex dtype. Got: {dt}")
        half = self._half_reduce("mean", dim, keepdim, dtype)
        return half if half is not None else self._reduce("mean", dim, keepdim, dt.numpy_dtype)

    def _minmax(self, fname, arg, dim, keepdim, result):
        if isinstance(dim, Tensor):  # t.max(other): elementwise
            return self._binary(dim, "maximum" if fname == "max" else "minimum")
        if dim is None:
            if self._data.size == 0:
                raise ValueError(f"{fname}(): expected a non-empty tensor when no dim is given; "
                                 f"specify the reduction dim with the 'dim' argument")
            return self._reduce(fname, None, False)
        d = norm_dim(dim, self._data.ndim)
        if self._data.ndim == 0:
            with self._guard():
                return result(self.clone(), self._wrap(self._xp.zeros((), np.int64)))
        if self._data.shape[d] == 0:
            raise ValueError(f"{fname}(): cannot reduce over dim {dim} of size 0 "
                             f"(shape {list(self._data.shape)})")
        values = self._reduce(fname, d, keepdim)
        with self._guard():
            idx = getattr(self._data, arg)(axis=d, keepdims=bool(keepdim)).astype(np.int64, copy=False)
        return result(values, self._wrap(idx))

    def max(self, dim=None, keepdim=False):  # noqa: A003
        """Max of all elements; with ``dim``, the (values, indices) namedtuple."""
        return self._minmax("max", "argmax", dim, keepdim, max_result)

    def min(self, dim=None, keepdim=False):  # noqa: A003
        return self._minmax("min", "argmin", dim, keepdim, min_result)

    def amax(self, dim=(), keepdim=False):
        return self._reduce("max", dim, keepdim)

    def amin(self, dim=(), keepdim=False):
        return self._reduce("min", dim, keepdim)

    def _arg(self, fname, dim, keepdim):
        arr = self._data
        if dim is None:
            with self._guard():
                idx = getattr(arr.reshape(-1), fname)()
                out = self._wrap(self._xp.asarray(idx, dtype=np.int64))
            return out.reshape([1] * arr.ndim) if keepdim else out
        return self._minmax(fname[3:], fname, dim, keepdim, lambda v, i: i)

    def argmax(self, dim=None, keepdim=False):
        return self._arg("argmax", dim, keepdim)

    def argmin(self, dim=None, keepdim=False):
        return self._arg("argmin", dim, keepdim)

    def any(self, dim=None, keepdim=False):  # noqa: A003
        return self._reduce("any", dim, keepdim)

    def all(self, dim=None, keepdim=False):  # noqa: A003
        return self._reduce("all", dim, keepdim)

    def var(self, dim=None, *, correction=1, keepdim=False):
        t = self if self.dtype._category > 1 else self.to(D.get_default_dtype())
        arr = t._data
        with np.errstate(**_IGNORE), self._guard():
            out = arr.var(axis=axes(dim, arr.ndim), ddof=correction, keepdims=bool(keepdim))
        return self._wrap(self._xp.asarray(out))

    def std(self, dim=None, *, correction=1, keepdim=False):
        return self.var(dim, correction=correction, keepdim=keepdim).sqrt()

    def cumsum(self, dim, *, dtype=None):
        d = norm_dim(dim, self._data.ndim)
        with self._guard():
            out = self._data.reshape(-1) if self._data.ndim == 0 else self._data
            out = out.cumsum(axis=d if self._data.ndim else 0, dtype=self._acc(dtype))
        return self._wrap(out.reshape(self._data.shape))

    def norm(self, p=2, dim=None, keepdim=False):
        """p-norm (p=2 default, any p > 0 or inf) over ``dim`` (default: all elements)."""
        a = self.abs() if self.dtype._category > 1 else self.to(D.get_default_dtype()).abs()
        if self.dtype.is_complex:
            a = a.to(self.dtype.to_real())
        if p == float("inf"):
            return a.amax(() if dim is None else dim, keepdim)
        if not isinstance(p, numbers.Real) or p <= 0:
            raise ValueError(f"norm: p must be a positive number or inf, got {p!r}")
        return (a ** p).sum(dim, keepdim) ** (1.0 / p)

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
        arr = self._data
        out = convert(arr, dev, None if dt is None else dt.numpy_dtype, copy)
        return self if out is arr else self._wrap(out)

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
        # _shm is imported on first use, not at the top: its imports (mmap, fcntl, secrets,
        # threading) would cost every `import ndist`, and most programs never share memory.
        from . import _shm  # noqa: PLC0415

        if type(self._data) is not np.ndarray:
            return self  # CUDA storage is shared through CUDA IPC, as in torch
        self._data = _shm.share_array(self._data)
        return self

    def is_shared(self) -> bool:
        from . import _shm  # noqa: PLC0415 - on first use, as in share_memory_

        if type(self._data) is not np.ndarray:
            return True
        return bool(_shm.is_shared(self._data))

    def is_pinned(self) -> bool:
        return False

    def __repr__(self) -> str:
        return tensor_repr(self.numpy(force=True), self.dtype, self.device)

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        if self._data.ndim == 0 and spec:
            return format(self.item(), spec)
        return repr(self)


def _rebuild_tensor(array: Any) -> Tensor:
    return Tensor._wrap(array)
