"""ndist dtypes: torch's names over NumPy dtypes, and torch's type promotion.

Each ``ndist.dtype`` wraps one NumPy dtype. Promotion follows
``torch.result_type``: operands are ranked as dimensioned tensors, zero-dim
tensors and Python scalars; a lower rank only changes the result when it is of
a higher category (bool < integer < floating < complex), and a Python float
or complex then contributes the *default* dtype, not float64.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

try:  # bfloat16 only when ml_dtypes is installed (it is a light NumPy extension).
    import ml_dtypes as _ml_dtypes
except ImportError:  # pragma: no cover - depends on the environment
    _ml_dtypes = None

__all__ = [
    "dtype",
    "bool",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "half",
    "float",
    "double",
    "short",
    "int",
    "long",
    "cfloat",
    "cdouble",
    "bfloat16",
    "get_default_dtype",
    "set_default_dtype",
    "promote_types",
    "result_type",
    "can_cast",
    "finfo",
    "iinfo",
]

_builtin_bool, _builtin_int, _builtin_float = bool, int, float

# category ranks
_BOOL, _INT, _FLOAT, _COMPLEX = 0, 1, 2, 3


class dtype:
    """A tensor element type (``ndist.float32`` ...); compares by identity."""

    __slots__ = ("_name", "_np", "_category", "__weakref__")

    def __init__(self, name: str, np_dtype: Any, category: int) -> None:
        self._name = name
        self._np = np.dtype(np_dtype)
        self._category = category

    @property
    def is_floating_point(self) -> _builtin_bool:
        return self._category == _FLOAT

    @property
    def is_complex(self) -> _builtin_bool:
        return self._category == _COMPLEX

    @property
    def is_signed(self) -> _builtin_bool:
        return self._category != _BOOL and not self._name.startswith("uint")

    @property
    def itemsize(self) -> _builtin_int:
        return self._np.itemsize

    @property
    def numpy_dtype(self) -> np.dtype:
        """The NumPy (or CuPy) dtype that stores this type."""
        return self._np

    def to_complex(self) -> "dtype":
        return {float64: complex128, complex128: complex128}.get(self, complex64)

    def to_real(self) -> "dtype":
        return {complex128: float64, complex64: float32}.get(self, self)

    def __repr__(self) -> str:
        return f"ndist.{self._name}"

    __str__ = __repr__

    def __reduce__(self):
        # Pickles by name, so the unpickled dtype is the same singleton.
        return (_by_name, (self._name,))


bool = dtype("bool", np.bool_, _BOOL)  # noqa: A001 - torch's name
uint8 = dtype("uint8", np.uint8, _INT)
uint16 = dtype("uint16", np.uint16, _INT)  # torch 2.3+: storage and casts, few kernels
uint32 = dtype("uint32", np.uint32, _INT)
uint64 = dtype("uint64", np.uint64, _INT)
int8 = dtype("int8", np.int8, _INT)
int16 = dtype("int16", np.int16, _INT)
int32 = dtype("int32", np.int32, _INT)
int64 = dtype("int64", np.int64, _INT)
float16 = dtype("float16", np.float16, _FLOAT)
float32 = dtype("float32", np.float32, _FLOAT)
float64 = dtype("float64", np.float64, _FLOAT)
complex64 = dtype("complex64", np.complex64, _COMPLEX)
complex128 = dtype("complex128", np.complex128, _COMPLEX)
bfloat16 = dtype("bfloat16", _ml_dtypes.bfloat16, _FLOAT) if _ml_dtypes is not None else None

if bfloat16 is None:  # pragma: no cover - depends on the environment
    __all__.remove("bfloat16")
    del bfloat16

half = float16
float = float32  # noqa: A001 - torch's name
double = float64
short = int16
int = int32  # noqa: A001 - torch's name
long = int64
cfloat = complex64
cdouble = complex128

_ALL = [d for d in (bool, uint8, uint16, uint32, uint64, int8, int16, int32, int64, float16, float32, float64,
                    complex64, complex128, globals().get("bfloat16")) if d is not None]
_NAMES = {d._name: d for d in _ALL}
_FROM_NP = {d._np: d for d in _ALL}


def _by_name(name: str) -> dtype:
    return _NAMES[name]


def supported_names() -> str:
    return ", ".join(d._name for d in _ALL)


def from_numpy_dtype(np_dtype: Any, *, what: str = "dtype") -> dtype:
    """The ndist dtype that stores as ``np_dtype``; TypeError for others."""
    try:
        return _FROM_NP[np.dtype(np_dtype)]
    except (KeyError, TypeError):
        raise TypeError(
            f"{what}: unsupported element type {np_dtype!r}; ndist supports {supported_names()}"
        ) from None


def to_dtype(value: Any, *, arg: str = "dtype") -> dtype:
    """Accept an ``ndist.dtype``, a NumPy dtype (or type) or a torch dtype name."""
    if isinstance(value, dtype):
        return value
    if isinstance(value, str):
        d = _NAMES.get(value) or _ALIASES.get(value)
        if d is not None:
            return d
        raise TypeError(f"{arg}: expected an ndist.dtype, got unknown name {value!r}; "
                        f"known: {supported_names()}")
    if value is _builtin_bool:
        return bool
    if value is _builtin_int:
        return int64
    if value is _builtin_float:
        return get_default_dtype()
    if value is complex:
        return get_default_dtype().to_complex()
    if type(value).__module__ == "torch" and hasattr(value, "is_floating_point"):
        name = str(value).rsplit(".", 1)[-1]
        if name in _NAMES:
            return _NAMES[name]
    try:
        np_dt = np.dtype(value)
    except TypeError:
        raise TypeError(f"{arg}: expected an ndist.dtype (e.g. ndist.float32), "
                        f"got {value!r} of type {type(value).__name__}") from None
    return from_numpy_dtype(np_dt, what=arg)


_ALIASES = {"half": half, "float": float, "double": double, "short": short, "int": int,
            "long": long, "cfloat": cfloat, "cdouble": cdouble}

# ---------------------------------------------------------------- default dtype
_default = [float32]


def get_default_dtype() -> dtype:
    """The floating dtype that Python floats and factories use (float32 at start)."""
    return _default[0]


def set_default_dtype(d: dtype) -> None:
    """Set the default floating dtype (float16, bfloat16, float32 or float64)."""
    d = to_dtype(d, arg="d")
    if not d.is_floating_point:
        raise TypeError(f"set_default_dtype: d must be a floating point dtype, got {d}")
    _default[0] = d


# ---------------------------------------------------------------- promotion
def promote_types(a: dtype, b: dtype) -> dtype:
    """torch.promote_types: the smallest dtype both ``a`` and ``b`` cast to."""
    if a is b:
        return a
    if a._category != b._category:
        hi, lo = (a, b) if a._category > b._category else (b, a)
        if hi._category == _COMPLEX and lo._category == _FLOAT:
            # complex64 + float64 -> complex128: keep the wider precision.
            return complex128 if lo is float64 else hi
        return hi
    if a._category == _INT:
        return _FROM_NP[np.promote_types(a._np, b._np)]
    if a._category == _FLOAT and {a._name, b._name} == {"float16", "bfloat16"}:
        return float32
    return a if a.itemsize >= b.itemsize else b


def _scalar_dtype(value: Any) -> dtype:
    if isinstance(value, _builtin_bool) or isinstance(value, np.bool_):
        return bool
    if isinstance(value, numbers.Integral):
        return int64
    if isinstance(value, numbers.Real):
        return get_default_dtype()
    if isinstance(value, numbers.Complex):
        return get_default_dtype().to_complex()
    raise TypeError(f"expected a tensor or a Python number, got {type(value).__name__}")


def _combine(higher: dtype | None, lower: dtype | None) -> dtype | None:
    # torch's combine_categories: ``higher`` is the higher-priority operand group.
    if higher is None:
        return lower
    if lower is None:
        return higher
    if higher._category == _COMPLEX:
        return higher
    if lower._category == _COMPLEX:
        return higher.to_complex() if higher._category == _FLOAT else lower
    if higher._category == _FLOAT:
        return higher
    if higher is bool or lower._category == _FLOAT:
        return promote_types(higher, lower)
    return higher


def result_type(*operands: Any) -> dtype:
    """torch.result_type over tensors and Python scalars (any number of them)."""
    dim = zero = scalar = None
    for x in operands:
        d = getattr(x, "dtype", None)
        if isinstance(d, dtype) and hasattr(x, "_data"):
            if x._data.ndim:
                dim = d if dim is None else promote_types(dim, d)
            else:
                zero = d if zero is None else promote_types(zero, d)
        else:
            d = _scalar_dtype(x)
            scalar = d if scalar is None else promote_types(scalar, d)
    out = _combine(dim, _combine(zero, scalar))
    if out is None:
        raise TypeError("result_type() needs at least one operand")
    return out


def can_cast(from_: dtype, to: dtype) -> _builtin_bool:
    """torch.can_cast: the casts in-place ops allow (no lowering of category)."""
    if from_._category == _COMPLEX and to._category != _COMPLEX:
        return False
    if from_._category == _FLOAT and to._category < _FLOAT:
        return False
    if from_._category != _BOOL and to is bool:
        return False
    return True


# ---------------------------------------------------------------- finfo / iinfo
class finfo:
    """Machine limits of a floating (or complex) dtype, like torch.finfo."""

    def __init__(self, type: dtype | None = None) -> None:  # noqa: A002 - torch's name
        d = get_default_dtype() if type is None else to_dtype(type, arg="type")
        if d._category < _FLOAT:
            raise TypeError(f"finfo: type must be a floating point or complex dtype, got {d}")
        d = d.to_real()
        fi = _ml_dtypes.finfo(d._np) if d._name == "bfloat16" else np.finfo(d._np)
        self.dtype = d._name
        self.bits = fi.bits
        self.eps = _builtin_float(fi.eps)
        self.max = _builtin_float(fi.max)
        self.min = _builtin_float(fi.min)
        self.tiny = _builtin_float(fi.tiny)
        self.smallest_normal = self.tiny
        self.resolution = _builtin_float(fi.resolution)

    def __repr__(self) -> str:
        return (f"finfo(resolution={self.resolution:g}, min={self.min:g}, max={self.max:g}, "
                f"eps={self.eps:g}, smallest_normal={self.tiny:g}, tiny={self.tiny:g}, "
                f"dtype={self.dtype})")


class iinfo:
    """Machine limits of an integer (or bool) dtype, like torch.iinfo."""

    def __init__(self, type: dtype) -> None:  # noqa: A002 - torch's name
        d = to_dtype(type, arg="type")
        if d._category > _INT:
            raise TypeError(f"iinfo: type must be an integer dtype, got {d}")
        ii = np.iinfo(np.uint8 if d is bool else d._np)
        self.dtype = d._name
        self.bits = ii.bits if d is not bool else 8
        self.min = 0 if d is bool else _builtin_int(ii.min)
        self.max = 1 if d is bool else _builtin_int(ii.max)

    def __repr__(self) -> str:
        return f"iinfo(min={self.min}, max={self.max}, dtype={self.dtype})"
