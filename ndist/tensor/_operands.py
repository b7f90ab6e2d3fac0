"""Operands of ``Tensor``'s elementwise ops, at the level of arrays: the same-device
rule, a value as an array of the target's library, a Python scalar cast to the
result type, and whether a NumPy / CuPy ValueError is a shape mismatch.

Functions of arrays and scalars; they know nothing of ``Tensor`` (its methods pass
``t._data``)."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from . import _dtype as D
from ._transfer import device_of_array, move

__all__ = ["SCALARS", "check_same_device", "to_operand_array", "cast_scalar", "is_shape_error"]

SCALARS = (numbers.Number, np.generic)


def check_same_device(op: str, da: Any, db: Any, *, allow_cpu_scalar: bool = True) -> None:
    """RuntimeError naming both devices when arrays ``da`` and ``db`` live on different ones.

    A 0-d CPU array may meet a CUDA array (it acts as a scalar), as in torch."""
    if type(da) is type(db) and (type(da) is np.ndarray or da.device.id == db.device.id):
        return
    if allow_cpu_scalar and type(db) is np.ndarray and db.ndim == 0:
        return
    raise RuntimeError(f"{op}: expected all tensors to be on the same device, but found at "
                       f"least two devices, {device_of_array(da)} and {device_of_array(db)}! "
                       f"Use .to(), .cuda(), .cpu() or copy_() to move one of them")


def to_operand_array(value: Any, ref: Any) -> Any:
    """``value`` (array, scalar, nested list) as something ``ref``'s library takes."""
    if type(ref) is np.ndarray:
        if type(value) is not np.ndarray and hasattr(value, "__cuda_array_interface__"):
            raise RuntimeError("expected a CPU value for a CPU tensor, got a CUDA array; "
                               "use .cpu() first")
        return value
    if isinstance(value, SCALARS):
        return value
    if type(value) is np.ndarray:
        return value[()] if value.ndim == 0 else move(value, ref)
    if isinstance(value, (list, tuple)):
        return move(np.asarray(value), ref)
    return value


def is_shape_error(exc: ValueError) -> bool:
    msg = str(exc)
    return "broadcast" in msg or "mismatch in its core dimension" in msg or "shape" in msg


def cast_scalar(value: Any, rt: D.dtype) -> Any:
    """A Python / NumPy scalar ready to meet an array of result type ``rt``."""
    # Python floats/complexes are "weak" in NumPy 2 and CuPy: they take the array's type.
    # Integers are wrapped into the result type like torch does (int8 + 1000 wraps).
    if rt._category >= 2 and not isinstance(value, np.generic):
        return value
    return np.asarray(value).astype(rt.numpy_dtype)[()]
