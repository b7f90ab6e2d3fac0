"""Which GPU a rank's CUDA backends use: ``device_id`` (the bound device) and the launch default.

* ``init_process_group(device_id=...)`` binds the process group to one CUDA
  device, as torch does: the ``nccl`` backend creates its communicator there
  (subgroups made by ``new_group`` inherit it).
* Without one, a rank started by a launcher (ndistrun, torchrun, mpiexec,
  srun: the local rank found by ``_env.detect``) that has not chosen a device
  uses ``LOCAL_RANK % device_count()`` for ``'cuda'`` (``ndist.tensor._cuda``:
  ``choose_device`` decides, ``current_device`` applies it and logs it at INFO).

The chosen ordinal reaches a backend as ``BackendContext.device_index``.
"""

from __future__ import annotations

import importlib.util
from typing import Any

__all__ = ["parse_device_id", "backend_device_index", "announce_local_rank"]


def parse_device_id(value: Any) -> int | None:
    """``device_id`` of init_process_group -> a CUDA ordinal, or None (no binding).

    Accepts an int ordinal, ``'cuda:N'``, an ``ndist.device`` or anything with
    ``type`` / ``index`` (a ``torch.device``); a CPU device binds nothing.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"device_id: expected an int, 'cuda:N' or a device, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"device_id: expected a CUDA ordinal >= 0, got {value}")
        return value
    if isinstance(value, str):
        from ..tensor._device import to_device

        value = to_device(value, arg="device_id")
    kind, index = getattr(value, "type", None), getattr(value, "index", None)
    if not isinstance(kind, str):
        raise TypeError(f"device_id: expected an int, 'cuda:N' or a device, got {type(value).__name__}")
    if kind == "cpu":
        return None
    if kind != "cuda" or index is None:
        raise ValueError(f"device_id: expected a CUDA device with an index such as 'cuda:0', got {str(value)!r}")
    return int(index)


def backend_device_index(bound: int | None) -> int | None:
    """The ordinal a group's CUDA backend uses (None without a usable GPU: the backend decides)."""
    from ..tensor import _cuda  # only for a CUDA backend: importing the tensor layer costs ~60 ms

    if not _cuda.is_available():
        return None
    if bound is not None:
        return _cuda.choose_device(bound, 0, True, None, _cuda.device_count())[0]
    return _cuda.current_device()  # the program's choice, else the launch default (LOCAL_RANK % count)


def announce_local_rank(local_rank: int | None) -> None:
    """Tell the CUDA layer the launch's local rank ('cuda' then means LOCAL_RANK % device_count()).

    Only where CuPy is installed: without it there is no CUDA device to choose, and
    ``import ndist.distributed`` / ``init_process_group`` stay clear of the tensor layer.
    """
    import sys

    if "ndist.tensor._cuda" not in sys.modules and importlib.util.find_spec("cupy") is None:
        return
    from ..tensor import _cuda

    _cuda.set_launch_local_rank(local_rank)
