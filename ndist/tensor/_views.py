"""Shape and view methods of ``ndist.Tensor``: reshape / view / permute / expand /
squeeze / chunk / split / unbind ... Every result but ``reshape``'s unavoidable copy
shares the tensor's storage."""

from __future__ import annotations

import numbers
import operator
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _dtype as D

if TYPE_CHECKING:
    from ._tensor import Tensor

__all__ = ["ViewOps", "ints", "norm_dim"]


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


class ViewOps:
    """Mixin of ``Tensor`` with the shape methods; works on ``self._data``."""

    _data: Any
    _wrap: Any

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
