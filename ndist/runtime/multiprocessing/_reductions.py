"""Reducers that move tensors through multiprocessing by reference, not by copy.

``init_reductions()`` registers :func:`reduce_tensor` with
``multiprocessing.reduction.ForkingPickler`` for ``ndist.Tensor`` (and its
subclasses). ``ForkingPickler`` is what every ``multiprocessing`` Queue, Pipe,
Connection and spawned Process argument goes through, in every context
(``spawn``, ``fork``, ``forkserver``), so once registered a CPU tensor sent
anywhere is first moved to shared memory (``share_memory_()``, in place, as
torch does; NumPy has no shared storage object, so other tensors viewing the
old private array keep it) and the receiver maps the same memory: an in-place change on
either side is seen by the other. NumPy arrays are left alone and keep the
stdlib's copy semantics.

What travels is a handle, per strategy:

* ``file_descriptor``: ``multiprocessing.reduction.DupFd`` of the segment's
  memfd. While a Process is being started the descriptor goes with the
  child; otherwise the sender's ``resource_sharer`` thread hands it over a
  Unix socket (``SCM_RIGHTS``) when the receiver unpickles. The sending
  process must therefore still be alive when the receiver unpickles.
* ``file_system``: the segment name in /dev/shm plus an in-flight count on
  the segment, so the name outlives the sender's own references until the
  receiver has opened it.

CUDA tensors go through CUDA IPC (``_cuda.py``).
"""

from __future__ import annotations

import logging

import numpy as np

from ...tensor import _shm

__all__ = ["init_reductions", "reduce_tensor", "reduce_array", "rebuild_tensor"]

log = logging.getLogger("ndist.runtime")

_registered: set[type] = set()


def reduce_array(arr: np.ndarray):
    """``(rebuild, args)`` for an array that lives in a shared segment.

    ``rebuild(*args)`` in any process (this one included) returns a view of the
    same memory with ``arr``'s shape, strides and dtype.
    """
    found = _shm.segment_of(arr)
    if found is None:
        raise ValueError("arr must be in shared memory (see ndist.tensor._shm.share_array), got a private array")
    seg, offset = found
    meta = (offset, arr.shape, arr.strides, arr.dtype)
    if seg.strategy == "file_descriptor":
        from multiprocessing.reduction import DupFd

        return rebuild_array_fd, (DupFd(_shm.sharing_fd(seg)), seg.nbytes) + meta
    _shm.pin(seg)
    return rebuild_array_name, (seg.name, seg.nbytes) + meta


def rebuild_array_fd(dupfd, nbytes, offset, shape, strides, dtype) -> np.ndarray:
    seg = _shm.open_fd(dupfd.detach(), nbytes)
    return _shm.array_from_segment(seg, offset, shape, strides, dtype)


def rebuild_array_name(name, nbytes, offset, shape, strides, dtype) -> np.ndarray:
    seg = _shm.open_name(name, nbytes)
    _shm.unpin(seg)
    return _shm.array_from_segment(seg, offset, shape, strides, dtype)


def reduce_tensor(t):
    """ForkingPickler reducer for ``ndist.Tensor``."""
    arr = t._data
    if not isinstance(arr, np.ndarray):
        from ._cuda import reduce_cuda_array

        fn, args = reduce_cuda_array(arr)
    else:
        if not _shm.is_shared(arr):
            # torch semantics: sending a tensor moves its storage to shared memory.
            share = getattr(t, "share_memory_", None)
            if share is not None:
                share()
            else:
                t._data = _shm.share_array(arr)
            arr = t._data
        fn, args = reduce_array(arr)
    return rebuild_tensor, (type(t), fn, args)


def rebuild_tensor(cls, fn, args):
    arr = fn(*args)
    wrap = getattr(cls, "_wrap", None)
    if wrap is None:  # a subclass without its own _wrap
        from ...tensor import Tensor

        return Tensor._wrap(arr)
    return wrap(arr)


def _tensor_classes() -> list[type]:
    try:
        from ...tensor import Tensor
    except ImportError:  # the tensor layer is not there (partial checkout)
        return []
    out, todo = [], [Tensor]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return out


def init_reductions() -> None:
    """Register the tensor reducers with ForkingPickler (idempotent).

    Also arms the shared-memory exit hook, so that this process reclaims at
    exit the file_system segments of children that died without releasing
    them (e.g. killed with SIGKILL), even if it never mapped one itself.
    """
    from multiprocessing.reduction import ForkingPickler

    _shm.install_exit_hook()

    for cls in _tensor_classes():
        if cls not in _registered:
            ForkingPickler.register(cls, reduce_tensor)
            _registered.add(cls)
            log.debug("registered multiprocessing reducer for %s", cls.__qualname__)
