"""CUDA tensors through multiprocessing: CUDA IPC memory handles.

As in torch, the receiver maps the *same* device memory (no copy), which
brings torch's rules with it:

* the producer must keep the original tensor alive for as long as any
  consumer uses it; freeing it earlier is undefined behaviour (the memory may
  be reused by the producer's memory pool);
* the producer's current stream is synchronized before the handle is made,
  so the consumer sees every write issued before the send; later writes need
  the processes' own synchronization;
* a handle opened in the process that made it gives back the producer's own
  memory (CUDA cannot open an IPC handle in its own process).

CuPy is imported inside these functions only.
"""

from __future__ import annotations

import ctypes
import os
import threading
import weakref

__all__ = ["reduce_cuda_array", "rebuild_cuda_array"]

_lock = threading.Lock()
_exported: "weakref.WeakValueDictionary[bytes, object]" = weakref.WeakValueDictionary()
_opened: "weakref.WeakValueDictionary[bytes, _IpcMapping]" = weakref.WeakValueDictionary()
_cuMemGetAddressRange = None


def _address_range(ptr: int) -> tuple[int, int]:
    """Base address and size of the cudaMalloc allocation that contains ``ptr``.

    A pooled CuPy array is a chunk of a larger allocation; IPC handles name the
    allocation, so the consumer needs the chunk's offset in it.
    """
    global _cuMemGetAddressRange
    if _cuMemGetAddressRange is None:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = getattr(lib, "cuMemGetAddressRange_v2")
        fn.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
        fn.restype = ctypes.c_int
        _cuMemGetAddressRange = fn
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    rc = _cuMemGetAddressRange(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
    if rc != 0:
        raise RuntimeError(f"cuMemGetAddressRange(0x{ptr:x}) failed with CUDA driver error {rc}")
    return base.value, size.value


class _IpcMapping:
    """An opened IPC handle; closes it when the last array using it is gone."""

    def __init__(self, ptr: int, device: int):
        self.ptr, self.device = ptr, device
        weakref.finalize(self, _close_handle, ptr, device)


def _close_handle(ptr: int, device: int) -> None:
    import cupy

    try:
        with cupy.cuda.Device(device):
            cupy.cuda.runtime.ipcCloseMemHandle(ptr)
    except Exception:  # interpreter shutdown / context gone: the driver frees it with the process
        pass


def reduce_cuda_array(arr):
    """``(rebuild_cuda_array, args)`` for a ``cupy.ndarray``."""
    import cupy

    if not isinstance(arr, cupy.ndarray):
        raise TypeError(f"arr must be a numpy.ndarray or cupy.ndarray, got {type(arr).__name__}")
    device = arr.device.id
    with cupy.cuda.Device(device):
        # cuMemGetAddressRange is a driver call and needs a current context, which a thread that
        # made no CUDA runtime call yet lacks (a Queue pickles on its feeder thread: error 201,
        # CUDA_ERROR_INVALID_CONTEXT, seen on an H100). cudaSetDevice makes the device's primary
        # context current; CuPy's Device skips it when the device number is already current.
        cupy.cuda.runtime.setDevice(device)
        ptr = arr.data.ptr
        base, size = _address_range(ptr)
        handle = bytes(cupy.cuda.runtime.ipcGetMemHandle(base))
        cupy.cuda.get_current_stream().synchronize()
    try:
        with _lock:
            _exported[handle] = arr
    except TypeError:  # not weak-referenceable in this CuPy version
        pass
    producer = (os.getpid(), base)
    return rebuild_cuda_array, (producer, device, handle, size, ptr - base, arr.shape, arr.strides, arr.dtype)


def rebuild_cuda_array(producer, device, handle, size, offset, shape, strides, dtype):
    import cupy

    pid, base = producer
    with cupy.cuda.Device(device):
        if pid == os.getpid():
            # Same process: the producer's own memory (kept alive by the producer, as
            # across processes; the exported array is held while it is alive).
            mem = cupy.cuda.UnownedMemory(base, size, _exported.get(handle), device_id=device)
            memptr = cupy.cuda.MemoryPointer(mem, offset)
        else:
            with _lock:
                mapping = _opened.get(handle)
                if mapping is None:
                    ptr = cupy.cuda.runtime.ipcOpenMemHandle(handle)
                    mapping = _IpcMapping(ptr, device)
                    _opened[handle] = mapping
            mem = cupy.cuda.UnownedMemory(mapping.ptr, size, mapping, device_id=device)
            memptr = cupy.cuda.MemoryPointer(mem, offset)
        return cupy.ndarray(tuple(shape), dtype, memptr, tuple(strides))
