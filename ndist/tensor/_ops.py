"""Arithmetic, comparison, in-place and unary methods of ``ndist.Tensor``.

Every operation is one NumPy / CuPy call on the whole array (no per-element
Python); what is added on top is torch's type promotion, the same-device
check, and torch's error behaviour (no warnings for inf / nan results).
"""

from __future__ import annotations

import contextlib
import numbers
import sys
from typing import Any

import numpy as np

from . import _dtype as D
from ._views import norm_dim

_SCALARS = (numbers.Number, np.generic)
_NULL = contextlib.nullcontext()
_IGNORE = {"all": "ignore"}


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


def _is_shape_error(exc: ValueError) -> bool:
    msg = str(exc)
    return "broadcast" in msg or "mismatch in its core dimension" in msg or "shape" in msg


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
        """(a, b, result dtype) with ``a`` and ``b`` ready for one ufunc call, or None
        when ``other`` is not an operand this op understands (-> NotImplemented)."""
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

    def _fast(self, other: Any, kind: str) -> Any:
        """The operand for one direct NumPy call when no promotion or check is needed
        (same-dtype CPU tensors, or a float tensor with a Python int/float), else None."""
        a = self._data
        if type(a) is not np.ndarray:
            return None
        k = a.dtype.kind
        if isinstance(other, TensorOps):
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
        if isinstance(other, TensorOps) and type(self._data) is np.ndarray \
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
            if not _is_shape_error(exc):
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
            if not _is_shape_error(exc):
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
