"""torch.distributed's availability and configuration queries.

``is_*_available``, ``is_backend_available``, ``BackendConfig`` /
``get_backend_config``, ``get_default_backend_for_device``, ``get_pg_count``,
``get_node_local_rank`` and ``is_torchelastic_launched``, with torch's
signatures, answered from ndist's backend registry and job environment.
"""

from __future__ import annotations

import os
from typing import Any

from . import _env
from ._group import Backend, parse_backend
from ._registry import get_backend_spec, is_registered

__all__ = [
    "BackendConfig", "get_backend_config", "get_default_backend_for_device", "get_node_local_rank",
    "get_pg_count", "is_backend_available", "is_gloo_available", "is_mpi_available", "is_nccl_available",
    "is_torchelastic_launched", "is_ucc_available", "is_xccl_available",
]

#: what ``init_process_group(backend=None)`` uses per device type
_DEFAULT_FOR_DEVICE = {"cpu": "socket", "cuda": "nccl"}


def _available(name: str) -> bool:
    try:
        return is_registered(name) and bool(get_backend_spec(name).available())
    except Exception:  # noqa: BLE001 - an availability probe that fails means "no"
        return False


def is_mpi_available() -> bool:
    """Whether the ``mpi`` backend can be used here (mpi4py importable)."""
    return _available("mpi")


def is_nccl_available() -> bool:
    """Whether the ``nccl`` backend can be used here (CuPy with NCCL and a GPU)."""
    return _available("nccl")


def is_gloo_available() -> bool:
    """Always ``True``: ``"gloo"`` names ndist's ``socket`` backend, which needs nothing extra."""
    return _available("gloo") or _available("socket")


def is_ucc_available() -> bool:
    """``False``: ndist has no UCC backend."""
    return False


def is_xccl_available() -> bool:
    """``False``: ndist has no XCCL (Intel GPU) backend."""
    return False


def is_backend_available(backend: str) -> bool:
    """Whether ``backend`` (a name or ``"cpu:socket,cuda:nccl"``) is registered and
    every backend it names can be used on this machine. Unknown names: ``False``."""
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected str, got {type(backend).__name__}")
    try:
        mapping = parse_backend(backend)
    except ValueError:
        return False
    return all(_available(name) for name in mapping.values())


class BackendConfig:
    """The device type -> backend map of a backend string, as torch's
    (``BackendConfig("cpu:gloo,cuda:nccl")``; ``repr`` gives ``"cpu:gloo,cuda:nccl"``)."""

    def __init__(self, backend: str) -> None:
        mapping = parse_backend(str(backend))  # ValueError naming the registered backends
        self.device_backend_map: dict[str, Backend] = {dev: Backend(name) for dev, name in mapping.items()}

    def get_device_backend_map(self) -> dict[str, Backend]:
        return self.device_backend_map

    def __repr__(self) -> str:
        return ",".join(f"{dev}:{name}" for dev, name in self.device_backend_map.items())


def get_backend_config(group: Any = None) -> str:
    """``"cpu:socket"``, ``"cpu:socket,cuda:nccl"``: each device type of ``group`` and its backend."""
    from ._world import resolve_group

    pg = resolve_group(group)
    if not pg.is_member:
        raise ValueError(f"group: global rank {pg._global_rank} is not a member of group {pg.group_name!r} "
                         f"with ranks {list(pg.ranks)}")
    return ",".join(f"{dev}:{name}" for dev, name in pg.backend_names.items())


def get_default_backend_for_device(device: Any) -> str:
    """The backend ``init_process_group(backend=None)`` uses for ``device``:
    ``"socket"`` for cpu (torch: gloo), ``"nccl"`` for cuda. ``device`` is a
    string (``"cuda:1"``) or anything with a ``.type`` (ndist / torch devices)."""
    dev = getattr(device, "type", device)
    if not isinstance(dev, str):
        raise TypeError(f"device: expected a str or a device, got {type(device).__name__}")
    kind = dev.split(":", 1)[0].strip().lower()
    backend = _DEFAULT_FOR_DEVICE.get(kind)
    if backend is None:
        raise ValueError(f"device: no default backend for device {device!r} (known: {sorted(_DEFAULT_FOR_DEVICE)})")
    return backend


def get_pg_count() -> int:
    """How many process groups this job created (the default group included); 0 before init."""
    from ._split import split_count
    from ._world import _world

    return _world.group_count + split_count()


def get_node_local_rank(fallback_rank: int | None = None) -> int:
    """This process's rank on its node: ``LOCAL_RANK`` (set by ndistrun and torchrun),
    else the MPI launcher's or Slurm's local rank, else ``fallback_rank``;
    ``RuntimeError`` when none is known."""
    local = _env.detect().local_rank
    if local is not None:
        return local
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RuntimeError(
        "LOCAL_RANK is not in the environment. Consider passing fallback_rank to allow `get_node_local_rank` to "
        "work, assuming you are not running in a multi-device context and want the code to run locally instead."
    )


def is_torchelastic_launched() -> bool:
    """Whether this process was started by ``ndistrun`` (``NDIST_RUN_ID`` is set),
    ndist's torchelastic, or by torchrun itself (``TORCHELASTIC_RUN_ID``)."""
    return "NDIST_RUN_ID" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ
