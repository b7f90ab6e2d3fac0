"""Copies between host memory and GPUs (the only ways across devices), and
``convert``, which moves and casts an array in one step (``Tensor.to``'s work).

Functions of NumPy / CuPy arrays; they know nothing of ``Tensor``."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from ._cuda import note_allocation, require_cupy, resolve
from ._device import CPU, device

_NULL = contextlib.nullcontext()


def device_of_array(arr: Any) -> device:
    if type(arr) is np.ndarray:
        return CPU
    return device("cuda", int(arr.device.id))


def convert(arr: Any, dev: Any, np_dt: Any, copy: bool) -> Any:
    """``arr`` on ``dev`` (None: where it is) as NumPy dtype ``np_dt`` (None: its own).

    Returns ``arr`` itself when nothing changes and ``copy`` is false; a new array
    otherwise (``copy`` forces one)."""
    here = device_of_array(arr)
    target = here if dev is None else resolve(dev)
    if np_dt is None:
        np_dt = arr.dtype
    if target == here:
        if np_dt == arr.dtype and not copy:
            return arr
        with _NULL if type(arr) is np.ndarray else arr.device:  # allocate on the array's GPU
            return arr.copy() if np_dt == arr.dtype else arr.astype(np_dt)
    out = move(arr, target)
    return out if np_dt == out.dtype else out.astype(np_dt, copy=False)


def move(arr: Any, target: Any) -> Any:
    """A copy of ``arr`` on ``target`` (an ndist.device with a concrete index, or an
    array whose device to use). Returns ``arr`` itself when it is already there."""
    if not isinstance(target, device):
        target = device_of_array(target)
    src_cpu = type(arr) is np.ndarray
    if target.type == "cpu":
        if src_cpu:
            return arr
        with arr.device:
            return arr.get()  # device -> host on the current stream, then waits
    cp = require_cupy()
    if src_cpu:
        with cp.cuda.Device(target.index):
            out = cp.asarray(arr)
        note_allocation(target.index)
        return out
    if int(arr.device.id) == target.index:
        return arr
    # GPU -> GPU: contiguous source, then a peer copy into the target device.
    with arr.device:
        src = cp.ascontiguousarray(arr)
        cp.cuda.get_current_stream().synchronize()
    with cp.cuda.Device(target.index):
        out = cp.empty(arr.shape, dtype=arr.dtype)
        if src.nbytes:
            out.data.copy_from_device(src.data, src.nbytes)
        cp.cuda.get_current_stream().synchronize()
    note_allocation(target.index)
    return out


def copy_into(dst: Any, src: Any) -> None:
    """``dst[...] = src`` with broadcasting and casting, ``src`` on any device."""
    if type(src) is not type(dst) or (type(dst) is not np.ndarray
                                      and int(src.device.id) != int(dst.device.id)):
        src = move(src, dst)
    if type(dst) is np.ndarray:
        np.copyto(dst, src, casting="unsafe")
        return
    import cupy as cp  # noqa: PLC0415 - dst is a CuPy array, so CuPy is loaded

    with dst.device:
        cp.copyto(dst, src, casting="unsafe")
