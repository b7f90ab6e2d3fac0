"""Reductions of ``ndist.Tensor``: sum / prod / mean / max / min (with the
``(values, indices)`` namedtuple for a dim) / amax / argmax / any / all / var / std /
cumsum / norm, each one NumPy or CuPy call over the whole array."""

from __future__ import annotations

import collections
import numbers
from typing import Any

import numpy as np

from . import _dtype as D
from ._views import norm_dim

__all__ = ["ReductionOps", "max_result", "min_result"]

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


class ReductionOps:
    """Mixin of ``Tensor`` with the reductions."""

    _data: Any
    _wrap: Any

    # reductions ------------------------------------------------------
    def _reduce(self, fname, dim, keepdim, dtype=None):
        arr = self._data
        if dim is None and not keepdim and type(arr) is np.ndarray:  # the common case, lean
            with np.errstate(**_IGNORE):
                out = getattr(arr, fname)() if dtype is None else getattr(arr, fname)(dtype=dtype)
            return self._wrap(np.asarray(out))
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
        if hasattr(dim, "_data"):  # t.max(other): elementwise
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
