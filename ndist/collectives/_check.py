"""Argument checking for the public collectives.

Every check runs before any byte is sent and raises ``ValueError`` /
``TypeError`` naming the argument, what was expected and what was given
(``RuntimeError`` for tensors on different devices, as torch does). The
group stays usable: nothing has been communicated when a check fails.
"""

from __future__ import annotations

import numbers
import sys
from typing import Any, Callable, Sequence

import numpy as np

from ._convert import as_array, device_type
from ._reduce_op import ReduceOp, _PremulSum

__all__ = [
    "check_bool", "tensor", "output", "tensor_list", "same_dtype", "same_device", "reduce_op",
    "root_rank", "peer_rank", "split_sizes", "check_tag", "common", "dtype_ok", "PLAIN_DTYPES", "PLAIN_OPS",
    "PLAIN_SUM",
]

_BITWISE = (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)


def _dtype_name(dtype) -> str:
    return str(np.dtype(dtype))


def check_bool(name: str, value: Any) -> bool:
    if value is False or value is True:  # the common case, without isinstance
        return value
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__} ({value!r})")
    return bool(value)


#: NumPy's own (singleton) dtypes that every backend carries: the common case is one
#: identity lookup. Others (bfloat16, float8, byte-swapped or exotic dtypes) go
#: through ``dtype_ok``.
_PLAIN_TYPES = (np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
                np.float16, np.float32, np.float64, np.complex64, np.complex128)
_PLAIN = frozenset(id(np.dtype(t)) for t in _PLAIN_TYPES)
#: the same dtypes, for the repeated call's check (``dt in PLAIN_DTYPES``: by equality,
#: so ``'q'`` passes as ``'l'`` does; both pass ``dtype_ok`` too)
PLAIN_DTYPES = frozenset(np.dtype(t) for t in _PLAIN_TYPES)
#: extension float types (ml_dtypes) that NumPy reports as kind "V"
_EXT_FLOATS = frozenset(("bfloat16", "float8_e4m3fn", "float8_e5m2"))
_NATIVE = "little-endian" if sys.byteorder == "little" else "big-endian"


def dtype_ok(arr: Any, name: str):
    """``arr`` when its dtype can be communicated; TypeError naming ``name`` otherwise.

    Only bool, integer, floating-point and complex elements in native byte order
    travel: strings, bytes, objects (pointers), datetimes, timedeltas and void /
    structured types would reach the peers as raw bytes, and a byte-swapped
    array would be read with the peers' byte order. torch has no such tensors,
    so they are refused rather than converted (a copy the caller did not ask for).
    """
    dt = arr.dtype
    if id(dt) in _PLAIN:
        return arr
    kind = dt.kind
    if not (kind in "biufc" or (kind == "V" and dt.name in _EXT_FLOATS and dt.fields is None)):
        raise TypeError(f"{name}: expected a tensor of a bool, integer, floating-point or complex dtype, "
                        f"got dtype {dt}")
    if not dt.isnative:
        raise TypeError(f"{name}: expected native byte order ({_NATIVE}), got dtype {dt.str!r} "
                        f"({'big-endian' if dt.byteorder == '>' else 'little-endian'}); convert it first: "
                        f"arr.astype({dt.newbyteorder('=').str!r})")
    return arr


def tensor(obj: Any, name: str):
    """The array behind a tensor argument (any strides), of a dtype that can be sent."""
    arr = obj if type(obj) is np.ndarray else as_array(obj, name)
    if id(arr.dtype) not in _PLAIN:
        dtype_ok(arr, name)
    return arr


def output(obj: Any, name: str):
    if type(obj) is np.ndarray:
        arr = obj
    else:
        arr = as_array(obj, name)
    if id(arr.dtype) not in _PLAIN:
        dtype_ok(arr, name)
    if isinstance(arr, np.ndarray) and not arr.flags.writeable:
        what = "array" if isinstance(obj, np.ndarray) else type(obj).__name__
        raise ValueError(f"{name}: expected a writable tensor, got a read-only {what} of shape {arr.shape}")
    return arr


def tensor_list(objs: Any, name: str, size: int | None, *, out: bool = False) -> list:
    """Arrays for a list argument; ``size``: required length (the group size) or None."""
    if type(objs) is not list and type(objs) is not tuple and (
            isinstance(objs, (str, bytes)) or not isinstance(objs, Sequence)):
        raise TypeError(f"{name}: expected a list of tensors, got {type(objs).__name__}")
    if size is not None and len(objs) != size:
        raise ValueError(f"{name}: expected a list of {size} tensors (the group size), got {len(objs)}")
    if out:
        # writable plain ndarrays of common dtypes pass as they are: no per-element name built
        return [o if type(o) is np.ndarray and o.flags.writeable and id(o.dtype) in _PLAIN
                else output(o, f"{name}[{i}]") for i, o in enumerate(objs)]
    return [o if type(o) is np.ndarray and id(o.dtype) in _PLAIN else tensor(o, f"{name}[{i}]")
            for i, o in enumerate(objs)]


def common(arrays: Sequence[Any], name_of: Callable[[int], str]) -> str:
    """Check ``arrays`` share one dtype and one device; return the device type.

    ``name_of(i)`` names ``arrays[i]`` in the error (built only on failure),
    with the messages of ``same_dtype`` / ``same_device``.
    """
    first = arrays[0]
    dtype = first.dtype
    if type(first) is np.ndarray:
        for arr in arrays:
            if type(arr) is not np.ndarray or arr.dtype != dtype:
                break
        else:
            return "cpu"
    named = [(name_of(i), a) for i, a in enumerate(arrays)]
    same_dtype(named)
    return same_device(named)


def same_dtype(named: Sequence[tuple[str, Any]]) -> np.dtype:
    """Check every array has the first one's dtype; TypeError names the first that differs."""
    first_name, first = named[0]
    for name, arr in named[1:]:
        if arr.dtype != first.dtype:
            raise TypeError(
                f"{name}: expected dtype {_dtype_name(first.dtype)} (the dtype of {first_name}), "
                f"got {_dtype_name(arr.dtype)}"
            )
    return first.dtype


def same_device(named: Sequence[tuple[str, Any]]) -> str:
    """The common device type; RuntimeError naming both devices otherwise (as torch)."""
    first_name, first = named[0]
    dev = device_type(first)
    for name, arr in named[1:]:
        other = device_type(arr)
        if other != dev:
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, "
                f"{dev} ({first_name}) and {other} ({name})"
            )
    return dev


def _scalar_factor(factor: Any):
    if isinstance(factor, (bool, np.bool_)):
        raise TypeError(f"op: PREMUL_SUM factor: expected a number or a one-element tensor, got bool")
    if isinstance(factor, numbers.Number):
        return factor
    try:
        arr = as_array(factor, "op: PREMUL_SUM factor")
    except TypeError:
        raise TypeError(
            f"op: PREMUL_SUM factor: expected a number or a one-element tensor, got {type(factor).__name__}"
        ) from None
    if arr.size != 1 or arr.dtype.kind not in "iufc":
        raise TypeError(
            f"op: PREMUL_SUM factor: expected a number or a one-element numeric tensor, "
            f"got a tensor of shape {tuple(arr.shape)} and dtype {_dtype_name(arr.dtype)}"
        )
    value = arr.reshape(-1)[0]
    return value.item() if hasattr(value, "item") else value


_checked_ops: dict = {}  # (ReduceOp, dtype) pairs that passed: the check is pure


def reduce_op(op: Any, dtype: np.dtype) -> tuple[ReduceOp, Any]:
    """``(ReduceOp, scale)`` for ``op`` on ``dtype``; ValueError when the op does not apply."""
    if type(op) is ReduceOp:
        key = (op._value_, dtype)  # Enum.__hash__ is Python code; the value string hashes in C
        try:
            return _checked_ops[key]
        except KeyError:
            pass
        result = _reduce_op(op, dtype)
        _checked_ops[key] = result
        return result
    return _reduce_op(op, dtype)


def _reduce_op(op: Any, dtype: np.dtype) -> tuple[ReduceOp, Any]:
    scale = None
    if isinstance(op, _PremulSum):
        scale = _scalar_factor(op.factor)
        op = ReduceOp.PREMUL_SUM
    elif not isinstance(op, ReduceOp):
        raise TypeError(f"op: expected a ndist.distributed.ReduceOp, got {type(op).__name__} ({op!r})")
    elif op is ReduceOp.PREMUL_SUM:
        raise ValueError("op: ReduceOp.PREMUL_SUM needs its factor: pass _make_nccl_premul_sum(factor)")
    dtype = np.dtype(dtype)
    kind = dtype.kind
    floating = kind in "fc" or (kind == "V" and dtype.name == "bfloat16")
    if kind == "c" and op in (ReduceOp.MIN, ReduceOp.MAX):
        raise ValueError(f"op: {op.name} is not defined on complex tensors (dtype {dtype})")
    if op in _BITWISE and kind not in "iub":
        raise ValueError(f"op: {op.name} needs an integer or bool tensor, got dtype {_dtype_name(dtype)}")
    if op is ReduceOp.AVG and not (floating or kind in "iu"):
        # integers: the sum divided toward zero, as NCCL's ncclAvg (_intavg.py); bool has
        # no average (torch's NCCL backend refuses it too)
        raise ValueError(f"op: AVG needs an integer, floating-point or complex tensor, got dtype {_dtype_name(dtype)}")
    if op is ReduceOp.PREMUL_SUM and not floating:
        raise ValueError(f"op: PREMUL_SUM needs a floating-point or complex tensor, got dtype {_dtype_name(dtype)}")
    if op is ReduceOp.PREMUL_SUM and isinstance(scale, complex) and kind != "c":
        raise TypeError(f"op: PREMUL_SUM factor {scale!r} is complex but the tensor's dtype is {dtype}")
    return op, scale


def _int(name: str, value: Any) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected an int rank, got {type(value).__name__} ({value!r})")
    return int(value)


def root_rank(pg, name: str, value: Any, group_name: str, group_value: Any, default: int | None = None) -> int:
    """The group rank of a root given as a global ``value`` or a ``group_value``."""
    if value is not None and group_value is not None:
        raise ValueError(f"{name} and {group_name}: expected at most one of them, got {name}={value!r} "
                         f"and {group_name}={group_value!r}")
    if group_value is not None:
        g = _int(group_name, group_value)
        if not 0 <= g < pg.size():
            raise ValueError(f"{group_name}: expected a group rank in [0, {pg.size()}), got {g}")
        return g
    if value is None:
        if default is None:
            raise ValueError(f"{name}: expected a global rank of group {list(pg.ranks)} (or {group_name}), got None")
        value = pg.ranks[default]
    v = _int(name, value)
    if v not in pg.ranks:
        raise ValueError(f"{name}: expected a global rank in group {list(pg.ranks)}, got {v}")
    return pg.group_rank(v)


def peer_rank(pg, name: str, value: Any, group_name: str, group_value: Any, *, allow_self: bool = False,
              allow_none: bool = False) -> int | None:
    if value is None and group_value is None and allow_none:
        return None
    g = root_rank(pg, name, value, group_name, group_value)
    if not allow_self and g == pg.rank():
        raise ValueError(f"{name}: expected a peer other than this process (rank {pg.ranks[g]}), got itself")
    return g


def check_tag(tag: Any) -> int:
    if isinstance(tag, (bool, np.bool_)) or not isinstance(tag, (int, np.integer)):
        raise TypeError(f"tag: expected an int, got {type(tag).__name__} ({tag!r})")
    if not 0 <= tag < _TAG_LIMIT:
        raise ValueError(f"tag: expected an int in [0, {_TAG_LIMIT}), got {tag}")
    return int(tag)


# MPI guarantees tags up to 32767; the top one is reserved for monitored_barrier.
_TAG_LIMIT = 32767
RESERVED_TAG = 32767


def split_sizes(name: str, sizes: Any, length: int, size: int, tensor_name: str) -> list[int]:
    """Split sizes along dim 0 of ``tensor_name`` (``length`` rows) over ``size`` ranks."""
    # a list or tuple is a Sequence: asked first, by exact type (typing.Sequence's
    # isinstance runs the ABC machinery, the largest cost of an uneven call)
    seq = type(sizes) is list or type(sizes) is tuple
    if sizes is None or ((seq or isinstance(sizes, Sequence)) and len(sizes) == 0):
        if length % size:
            raise ValueError(
                f"{name}: not given, so dim 0 of {tensor_name} ({length}) must divide evenly by the "
                f"group size {size}"
            )
        return [length // size] * size
    if not seq and (isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence)):
        raise TypeError(f"{name}: expected a list of ints, got {type(sizes).__name__}")
    if len(sizes) != size:
        raise ValueError(f"{name}: expected {size} sizes (the group size), got {len(sizes)}: {list(sizes)}")
    out = []
    for i, s in enumerate(sizes):
        if type(s) is not int and (isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer))):
            raise TypeError(f"{name}[{i}]: expected an int, got {type(s).__name__} ({s!r})")
        if s < 0:
            raise ValueError(f"{name}[{i}]: expected a size >= 0, got {s}")
        out.append(int(s))
    if sum(out) != length:
        raise ValueError(
            f"{name}: sizes {out} sum to {sum(out)}, but dim 0 of {tensor_name} has {length} rows"
        )
    return out


# ----------------------------------------------------- the repeated call's tables
def _plain_ops() -> dict:
    table = {}
    for op in ReduceOp:
        if op is ReduceOp.PREMUL_SUM:  # its factor is per call
            continue
        for dt in PLAIN_DTYPES:
            try:
                table[op._value_, dt] = _reduce_op(op, dt)
            except ValueError:
                pass
    return table


#: The repeated call's op check (``_api``), one lookup: ``(op value, dtype)`` ->
#: ``reduce_op``'s result, for every ReduceOp but PREMUL_SUM and every dtype of
#: ``PLAIN_DTYPES`` it applies to. A pair not in it takes the general path.
PLAIN_OPS: dict = _plain_ops()
#: ``PLAIN_OPS`` for ``ReduceOp.SUM``, the default, keyed by the dtype alone.
PLAIN_SUM: dict = {dt: v for (name, dt), v in PLAIN_OPS.items() if name == ReduceOp.SUM._value_}
