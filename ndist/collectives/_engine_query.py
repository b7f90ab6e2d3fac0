"""``get_engine(group, device)``: which engine runs a group's collectives (an ndist extension)."""

from __future__ import annotations

from ..runtime import resolve_group

__all__ = ["get_engine"]


def get_engine(group=None, device: str = "cpu") -> str:
    """The engine under ``group``'s collectives on ``device``: ``"native"`` (the socket
    backend's compiled same-host engine), ``"python"`` (its Python engine: groups that span
    hosts, ``NDIST_ENGINE=python``, or no compiled extension), or, for the other
    backends, which have no engines, the backend's name (``"mpi"``, ``"nccl"``).

    The socket backend settles it at the group's first collective; asked before, it
    answers what that collective will use, unless a rank turns out to be on another host.
    """
    backend = resolve_group(group).backend_for(device)
    backend = getattr(backend, "inner", backend)  # CUDA staging wraps a CPU backend
    return getattr(backend, "engine", None) or getattr(backend, "name", type(backend).__name__)
