"""Turn what users pass (ndist.Tensor, NumPy, CuPy, torch, anything with
``__dlpack__`` / the array interface, and objects that only export the buffer
protocol: memoryview, bytearray, bytes, array.array, ctypes arrays, mmap) into
arrays over the *same memory*.

Nothing here copies except ``contiguous_input`` / ``contiguous_output`` for
non-contiguous arrays; an output staged that way is written back by a step
queued in ``post`` (run through ``Work.then`` once the backend finished).
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import numpy as np

__all__ = ["as_array", "device_type", "contiguous_input", "contiguous_output", "ArrayLike", "BUFFER_FORMATS"]

ArrayLike = Any

_DLPACK_CPU = 1
_DLPACK_CUDA = (2, 3, 13)  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged


def _is_ndist_tensor(obj) -> bool:
    try:
        from ..tensor import Tensor
    except ImportError:  # pragma: no cover - the tensor layer always ships with ndist
        return False
    return isinstance(obj, Tensor)


def _module(obj) -> str:
    return type(obj).__module__ or ""


def as_array(obj: ArrayLike, name: str):
    """A NumPy / CuPy array viewing ``obj``'s memory (any strides), or TypeError naming ``name``."""
    if isinstance(obj, np.ndarray):
        return obj
    if _is_ndist_tensor(obj):
        return obj._data
    mod = _module(obj)
    if mod.startswith("cupy"):
        return obj
    if mod.startswith("torch"):
        return _from_torch(obj, name)
    if isinstance(obj, (list, tuple, dict, str, int, float, complex, bool)) or obj is None:
        raise TypeError(f"{name}: expected a tensor (ndist.Tensor, numpy/cupy array, torch tensor), "
                        f"got {type(obj).__name__}")
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        dev = obj.__dlpack_device__()[0]
        if dev == _DLPACK_CPU:
            return np.from_dlpack(obj)
        if dev in _DLPACK_CUDA:
            import cupy

            return cupy.from_dlpack(obj)
    if hasattr(obj, "__cuda_array_interface__"):
        import cupy

        return cupy.asarray(obj)
    if hasattr(obj, "__array_interface__") or hasattr(obj, "__array_struct__"):
        return np.asarray(obj)
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError(f"{name}: expected a tensor (ndist.Tensor, numpy/cupy array, torch tensor or an object "
                        f"with __dlpack__ or the buffer protocol), got {type(obj).__name__}") from None
    except (ValueError, BufferError) as err:  # a released memoryview, an exporter that refused
        raise ValueError(f"{name}: expected a readable buffer, got {type(obj).__name__} ({err})") from None
    return _from_buffer(view, type(obj).__name__, name)


# ------------------------------------------------------------ the buffer protocol
#: A buffer's struct format character (PEP 3118) -> the NumPy dtype its items are read as
#: (native sizes). ``'?'`` is bool, ``'Zf'`` / ``'Zd'`` complex. Any other format (a repeat
#: count, a struct, ``'P'``, ``'s'``, ``'g'``...) is refused. FastLane (native/clane.c) reads
#: the same table.
BUFFER_FORMATS = {code: np.dtype(code) for code in ("b", "B", "h", "H", "i", "I", "l", "L", "q", "Q", "e", "f",
                                                    "d", "?")}
BUFFER_FORMATS.update({"Zf": np.dtype(np.complex64), "Zd": np.dtype(np.complex128)})
_FORMAT_NAMES = ", ".join(BUFFER_FORMATS)
_LITTLE = sys.byteorder == "little"
_NATIVE_ORDER = "little-endian" if _LITTLE else "big-endian"
#: the byte-order prefixes of the other order ('!' is network order, big-endian); '@', '=' and
#: the machine's own are native
_FOREIGN_PREFIXES = (">", "!") if _LITTLE else ("<",)


def buffer_dtype(fmt: str | None, itemsize: int, what: str, name: str) -> np.dtype:
    """The dtype of a buffer's items: ``fmt`` (None: bytes, ``'B'``), native byte order; with
    another prefix than '@' the sizes may be struct's standard ones (``'=l'``: 4 bytes), so the
    item size decides: the format's kind at ``itemsize`` bytes. TypeError naming ``name`` (and
    ``what``, the object's type) otherwise."""
    fmt = "B" if fmt is None else fmt
    prefix = fmt[:1] if fmt[:1] in "@=<>!" else ""
    code = fmt[len(prefix):]
    dt = BUFFER_FORMATS.get(code)
    if dt is None:
        raise TypeError(f"{name}: expected a buffer of format {_FORMAT_NAMES} (struct's codes, native byte order), "
                        f"got format {fmt!r} ({what})")
    if prefix in _FOREIGN_PREFIXES:
        raise TypeError(f"{name}: expected native byte order ({_NATIVE_ORDER}), got format {fmt!r} ({what}, "
                        f"{'big' if _LITTLE else 'little'}-endian)")
    if dt.itemsize != itemsize:
        sized = f"{dt.kind}{itemsize}" if dt.kind in "iufc" else None
        try:
            dt = np.dtype(sized) if sized else None
        except TypeError:
            dt = None
        if dt is None:
            raise TypeError(f"{name}: expected items of {BUFFER_FORMATS[code].itemsize} bytes for format {fmt!r}, "
                            f"got {itemsize}-byte items ({what})")
    return dt


def _from_buffer(view: memoryview, what: str, name: str) -> np.ndarray:
    """A NumPy array over ``view``'s memory (zero-copy; writable when the buffer is), of the dtype of
    its format and its shape, any strides. A buffer with suboffsets (PEP 3118's indirect,
    PIL-style layout: arrays of pointers) is refused, naming ``name``: NumPy cannot view it."""
    if view.suboffsets:
        raise TypeError(f"{name}: expected a buffer without suboffsets (one block of memory, any strides), "
                        f"got {what} with suboffsets {view.suboffsets} (an indirect, PIL-style buffer: copy it "
                        f"into one block first)")
    dt = buffer_dtype(view.format, view.itemsize, what, name)
    if view.c_contiguous:
        return np.frombuffer(view, dtype=dt).reshape(view.shape)
    arr = np.asarray(view)  # (strided: NumPy reads the layout; the dtype is the table's)
    return arr if arr.dtype == dt else arr.view(dt)


def _from_torch(t, name: str):
    import torch  # only reached when the user passed a torch tensor

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor, got {type(t).__module__}.{type(t).__name__}")
    t = t.detach()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return _from_torch(t.view(torch.int16), name).view(ml_dtypes.bfloat16)
    if t.device.type == "cpu":
        return t.numpy()  # shares memory, keeps strides
    if t.device.type == "cuda":
        import cupy

        return cupy.from_dlpack(t)
    raise TypeError(f"{name}: torch tensors on device {t.device} are not supported (cpu or cuda expected)")


def device_type(arr) -> str:
    return "cpu" if isinstance(arr, np.ndarray) else "cuda"


def contiguous_input(arr):
    """``arr`` itself when C-contiguous, else a contiguous copy (inputs are only read)."""
    if arr.flags.c_contiguous:
        return arr
    return arr.copy(order="C")


def contiguous_output(arr, post: list[Callable[[], None]]):
    """A C-contiguous buffer for ``arr``; when staged, queue the write-back into ``post``."""
    if arr.flags.c_contiguous:
        return arr
    staged = arr.copy(order="C")

    def write_back() -> None:
        arr[...] = staged

    post.append(write_back)
    return staged


def _bounds(arr) -> tuple[int, int]:
    """Memory extent of a C-contiguous array (all that ``unaliased`` sees)."""
    ptr = arr.__array_interface__["data"][0] if isinstance(arr, np.ndarray) else arr.data.ptr
    return ptr, ptr + arr.nbytes


def unaliased(inputs: list, outputs: list) -> list:
    """``inputs``, with a copy of each one whose memory overlaps an output.

    Backends may not read and write the same memory in one call (MPI forbids
    aliased buffers); torch users write ``all_to_all_single(t, t)`` or
    ``all_gather(outs, outs[rank])``, so such inputs are copied first.
    """
    if len(inputs) == 1 and len(outputs) == 1:
        i, o = inputs[0], outputs[0]
        if type(i) is np.ndarray and type(o) is np.ndarray:
            return [i.copy()] if np.may_share_memory(i, o) else inputs
    if len(inputs) * len(outputs) <= 16 and all(isinstance(a, np.ndarray) for a in (*inputs, *outputs)):
        # few pairs: NumPy's own bounds check, cheaper than building extents
        if not any(np.may_share_memory(i, o) for i in inputs for o in outputs):
            return inputs
    spans = [_bounds(o) for o in outputs if o.size]
    if not spans:
        return inputs
    result = []
    for arr in inputs:
        if arr.size:
            lo, hi = _bounds(arr)
            if any(lo < ohi and olo < hi for olo, ohi in spans):
                arr = arr.copy()
        result.append(arr)
    return result
