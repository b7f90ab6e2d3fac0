"""Shape and dim arguments: ``ints`` reads a size (``f(2, 3)`` / ``f((2, 3))``),
``norm_dim`` a (possibly negative) dim, ``axes`` a reduction's dim or dims.

Plain functions of ints and tuples; they know nothing of ``Tensor`` (a 1-element
integer tensor is accepted where an int is, read through its ``item()``)."""

from __future__ import annotations

import numbers
import operator
from typing import Any

import numpy as np

__all__ = ["ints", "norm_dim", "axes"]


def ints(args: tuple, name: str) -> tuple[int, ...]:
    """``f(2, 3)`` / ``f((2, 3))`` / ``f([2, 3])`` -> (2, 3), checking each is an int."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    out = []
    for a in args:
        if isinstance(a, bool) or not isinstance(a, (numbers.Integral, np.integer)):
            if hasattr(a, "_data") and a._data.size == 1 and a._data.dtype.kind in "iu":
                a = a.item()
            else:
                raise TypeError(f"{name}: expected a sequence of ints, got {args!r} "
                                f"(element {a!r} is {type(a).__name__})")
        out.append(operator.index(a))
    return tuple(out)


def norm_dim(d: Any, ndim: int, name: str = "dim", *, extra: int = 0) -> int:
    """Normalise a (possibly negative) dim; ValueError naming the valid range."""
    if isinstance(d, bool) or not isinstance(d, (numbers.Integral, np.integer)):
        raise TypeError(f"{name}: expected an int, got {d!r} of type {type(d).__name__}")
    n = max(ndim + extra, 1)
    if not -n <= d < n:
        raise ValueError(f"{name}: dimension out of range (expected to be in range of "
                         f"[{-n}, {n - 1}], but got {d})")
    return int(d) % n


def axes(dim: Any, ndim: int) -> Any:
    """A reduction's ``dim`` (None, an int, or a tuple / list of ints) as NumPy's ``axis``."""
    if dim is None:
        return None
    if isinstance(dim, (tuple, list)):
        if not dim:
            return None  # torch: an empty dim list reduces over everything
        out = tuple(norm_dim(d, ndim) for d in dim)
        if len(set(out)) != len(out):
            raise ValueError(f"dim: {list(dim)} repeats a dimension")
        return out if ndim else None
    d = norm_dim(dim, ndim)
    return d if ndim else None
