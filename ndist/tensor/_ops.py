"""Arithmetic, comparison, in-place and reduction methods of ``ndist.Tensor``.

Every operation is one NumPy / CuPy call on the whole array (no per-element
Python); what is added on top is torch's type promotion, the same-device
check, and torch's error behaviour (no warnings for inf / nan results).
"""

from __future__ import annotations

import collections
import contextlib
import numbers
import sys
from typing import Any

import numpy as np

from . import _dtype as D

_SCALARS = (numbers.Number, np.generic)
_NULL = contextlib.nullcontext()
_IGNORE = {"all": "ignore"}



def _result_type(name: str):
    base = collections.namedtuple(name, ["values", "indices"])

    def __repr__(self) -> str:  # torch's layout: one field per line
        return f"ndist.return_types.{name}(\nvalues={self.values!r},\nindices={self.indices!r})"

    cls = type(name, (base,), {"__slots__": (), "__repr__": __repr__})
    cls.__module__ = "ndist.return_types"
    return cls


max_result = _result_type("max")
min_result = _result_type("min")


def norm_dim(d: Any, ndim: int, name: str = "dim", *, extra: int = 0) -> int:
    """Normalise a (possibly negative) dim; ValueError naming the valid range."""
    if isinstance(d, bool) or not isinstance(d, (numbers.Integral, np.integer)):
        raise TypeError(f"{name}: expected an int, got {d!r} of type {type(d).__name__}")
    n = max(ndim + extra, 1)
    if not -n <= d < n:
        raise ValueError(f"{name}: dimension out of range (expected to be in range of "
                         f"[{-n}, {n - 1}], but got {d})")
    return int(d) % n


def _axes(dim: Any, ndim: int) -> Any:
    if dim is None:
        return None
    if isinstance(dim, (tuple, list)):
        if not dim:
            return None  # torch: an empty dim list reduces over everything
        axes = tuple(norm_dim(d, ndim) for d in dim)
        if len(set(axes)) != len(axes):
            raise ValueError(f"dim: {list(dim)} repeats a dimension")
        return axes if ndim else None
    d = norm_dim(dim, ndim)
    return d if ndim else None


def check_same_device(op: str, a: Any, b: Any, *, allow_cpu_scalar: bool = True) -> None:
    """RuntimeError naming both devices when ``a`` and ``b`` live on different ones.

    A 0-d CPU tensor may meet a CUDA tensor (it acts as a scalar), as in torch."""
    da, db = a._data, b._data
    if type(da) is type(db) and (type(da) is np.ndarray or da.device.id == db.device.id):
        return
    if allow_cpu_scalar and type(db) is np.ndarray and db.ndim == 0:
        return
    raise RuntimeError(f"{op}: expected all tensors to be on the same device, but found at "
                       f"least two devices, {a.device} and {b.device}! Use .to(), .cuda(), "
                       f".cpu() or copy_() to move one of them")


def to_operand_array(value: Any, ref: Any) -> Any:
    """``value`` (tensor, array, scalar, nested list) as something ``ref``'s library takes."""
    if isinstance(value, TensorOps):
        value = value._data
    if type(ref) is np.ndarray:
        if type(value) is not np.ndarray and hasattr(value, "__cuda_array_interface__"):
            raise RuntimeError("expected a CPU value for a CPU tensor, got a CUDA array; "
                               "use .cpu() first")
        return value
    if isinstance(value, _SCALARS):
        return value
    from ._transfer import move  # noqa: PLC0415

    if type(value) is np.ndarray:
        return value[()] if value.ndim == 0 else move(value, ref)
    if isinstance(value, (list, tuple)):
        return move(np.asarray(value), ref)
    return value


def _scalar(value: Any, rt: D.dtype) -> Any:
    # Python floats/complexes are "weak" in NumPy 2 and CuPy: they take the array's type.
    # Integers are wrapped into the result type like torch does (int8 + 1000 wraps).
    if rt._category >= 2 and not isinstance(value, np.generic):
        return value
    return np.asarray(value).astype(rt.numpy_dtype)[()]


class TensorOps:
    """Mixin of ``Tensor`` with the operators; works on ``self._data``."""

    _data: Any
    _wrap: Any

    @property
    def _xp(self):
        return np if type(self._data) is np.ndarray else sys.modules["cupy"]

    def _guard(self):
        arr = self._data
        return _NULL if type(arr) is np.ndarray else arr.device

    # ------------------------------------------------------------ binary core
    def _prep(self, other: Any, op: str, kind: str):
        """(a, b, result dtype, ok) with ``a`` and ``b`` ready for one ufunc call."""
        a = self._data
        if isinstance(other, TensorOps):
            check_same_device(op, self, other)
            b = other._data
            da, db = self.dtype, other.dtype
            rt = da if da is db else D.result_type(self, other)
            if type(b) is not type(a):  # 0-d CPU tensor with a CUDA tensor
                b = b.item()
        elif isinstance(other, _SCALARS):
            rt = D.result_type(self, other)
            b = other
        elif isinstance(other, (np.ndarray, list, tuple)) or hasattr(other, "__cuda_array_interface__"):
            from ._factories import as_tensor  # noqa: PLC0415

            return self._prep(as_tensor(other, device=self.device), op, kind)
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
        if isinstance(b, _SCALARS):
            b = _scalar(b, rt)
        elif b.dtype != np_rt:
            b = b.astype(np_rt)
        if kind in ("floordiv", "mod") and rt._category < 2 and not (b != 0).all():
            raise ZeroDivisionError(f"{op}: integer division by zero")
        return a, b, rt

    def _binary(self, other: Any, fname: str, kind: str = "arith", reverse: bool = False):
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
            what = "are not compatible" if fname == "matmul" else "are not broadcastable"
            raise ValueError(f"{fname}: shapes {list(np.shape(a))} and {list(np.shape(b))} "
                             f"{what} ({exc})") from None
        return self._wrap(np.asarray(out) if isinstance(out, np.generic) else out)

    def _inplace(self, other: Any, fname: str, kind: str = "arith"):
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
        if not isinstance(o, TensorOps):
            return NotImplemented
        if self._data.ndim == 0 or o._data.ndim == 0:
            raise ValueError(f"matmul: both arguments need at least 1 dimension, got shapes "
                             f"{list(self._data.shape)} and {list(o._data.shape)}")
        return self._binary(o, "matmul")

    def __rmatmul__(self, o):
        if isinstance(o, (np.ndarray, list)):
            from ._factories import as_tensor  # noqa: PLC0415

            return as_tensor(o, device=self.device) @ self
        return NotImplemented

    # comparisons -----------------------------------------------------
    def __eq__(self, o): return self._binary(o, "equal", "cmp")  # noqa: E704
    def __ne__(self, o): return self._binary(o, "not_equal", "cmp")  # noqa: E704
    def __lt__(self, o): return self._binary(o, "less", "cmp")  # noqa: E704
    def __le__(self, o): return self._binary(o, "less_equal", "cmp")  # noqa: E704
    def __gt__(self, o): return self._binary(o, "greater", "cmp")  # noqa: E704
    def __ge__(self, o): return self._binary(o, "greater_equal", "cmp")  # noqa: E704

    def __hash__(self) -> int:
        return id(self)

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
            out = q._xp.trunc(q._data)
            rt = D.result_type(self, other)
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
        axes = tuple(norm_dim(d, self._data.ndim) for d in (
            dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims))
        with self._guard():
            return self._wrap(self._xp.flip(self._data, axes).copy())

    # whole-tensor state -------------------------------------------------
    def clone(self):
        with self._guard():
            return self._wrap(self._data.copy())

    def copy_(self, src, non_blocking: bool = False):
        """Copy ``src`` (broadcast, cast; any device) into this tensor, in place."""
        from ._transfer import copy_into  # noqa: PLC0415

        if isinstance(src, TensorOps):
            copy_into(self._data, src._data)
        elif isinstance(src, _SCALARS):
            self.fill_(src)
        else:
            copy_into(self._data, np.asarray(src))
        return self

    def fill_(self, value):
        if isinstance(value, TensorOps):
            if value._data.ndim:
                raise ValueError(f"fill_: only supports a 0-dimension value tensor, got one with "
                                 f"{value._data.ndim} dimensions")
            value = value.item()
        if not isinstance(value, _SCALARS):
            raise TypeError(f"fill_: value must be a number, got {type(value).__name__}")
        with self._guard():
            self._data.fill(value)
        return self

    def zero_(self):
        return self.fill_(0)

    # reductions ------------------------------------------------------
    def _reduce(self, fname, dim, keepdim, dtype=None):
        arr = self._data
        kw = {"axis": _axes(dim, arr.ndim), "keepdims": bool(keepdim)}
        if dtype is not None:
            kw["dtype"] = dtype
        with np.errstate(**_IGNORE), self._guard():
            out = getattr(arr, fname)(**kw)
        return self._wrap(np.asarray(out) if isinstance(out, np.generic) else out)

    def _acc(self, dtype):
        if dtype is not None:
            return D.to_dtype(dtype).numpy_dtype
        return np.int64 if self._data.dtype.kind in "biu" else None

    def sum(self, dim=None, keepdim=False, *, dtype=None):  # noqa: A003
        return self._reduce("sum", dim, keepdim, self._acc(dtype))

    def prod(self, dim=None, keepdim=False, *, dtype=None):
        return self._reduce("prod", dim, keepdim, self._acc(dtype))

    def mean(self, dim=None, keepdim=False, *, dtype=None):
        dt = self.dtype if dtype is None else D.to_dtype(dtype)
        if dt._category < 2:
            raise TypeError(f"mean(): could not infer output dtype. Input dtype must be either a "
                            f"floating point or complex dtype. Got: {dt}")
        return self._reduce("mean", dim, keepdim, dt.numpy_dtype)

    def _minmax(self, fname, arg, dim, keepdim, result):
        if isinstance(dim, TensorOps):  # t.max(other): elementwise
            return self._binary(dim, "maximum" if fname == "max" else "minimum")
        if dim is None:
            if self._data.size == 0:
                raise ValueError(f"{fname}(): expected a non-empty tensor when no dim is given; "
                                 f"specify the reduction dim with the 'dim' argument")
            return self._reduce(fname, None, False)
        d = norm_dim(dim, self._data.ndim)
        if self._data.ndim == 0:
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
            out = arr.var(axis=_axes(dim, arr.ndim), ddof=correction, keepdims=bool(keepdim))
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

    # comparisons of whole tensors ---------------------------------------
    def equal(self, other) -> bool:
        """True if ``other`` has the same shape and the same elements."""
        if not isinstance(other, TensorOps):
            raise TypeError(f"equal: other must be a tensor, got {type(other).__name__}")
        check_same_device("equal", self, other, allow_cpu_scalar=False)
        if self._data.shape != other._data.shape:
            return False
        return bool((self == other).all().item())

    def isclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
        if isinstance(other, TensorOps):
            check_same_device("isclose", self, other)
            other = other._data
        with np.errstate(**_IGNORE), self._guard():
            out = self._xp.isclose(self._data, other, rtol=rtol, atol=atol, equal_nan=equal_nan)
        return self._wrap(out)

    def allclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False) -> bool:
        return bool(self.isclose(other, rtol, atol, equal_nan).all().item())
