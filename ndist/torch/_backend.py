"""The creator torch calls for backend ``"ndist"``, its options and the registration.

``torch.distributed.init_process_group("ndist")`` (and ``new_group``) calls
``create`` with torch's ``_DistributedBackendOptions`` (the group's store,
rank, size, timeout, name and global ranks) and the ``pg_options`` the user
passed. The job secret that authenticates ndist's data connections is agreed
through that store: ``$NDIST_SECRET`` when set (ndistrun sets it), else the
first rank's random one; it is as private as torch's store is. Creating the
default group also starts the member watch (``_watch``) through that store.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass
from typing import Any

import torch.distributed as tdist

from ._group import BACKEND_NAME, ProcessGroupNdist
from . import _compiled, _rendezvous, _secret, _shrink, _watch
from ._store import TorchStore

__all__ = ["Options", "create", "register", "ENGINE_ENV", "ENGINES"]

#: picks the engine when no ``pg_options`` are given (``socket`` or ``mpi``)
ENGINE_ENV = "NDIST_TORCH_ENGINE"
ENGINES = ("socket", "mpi")

_lock = threading.Lock()


@dataclass(frozen=True)
class Options:
    """``pg_options`` for backend ``"ndist"``.

    ``engine``: ndist's backend underneath, ``"socket"`` (shared memory on one
    host, TCP across hosts) or ``"mpi"`` (mpi4py; run under ``mpiexec``, with
    torch's global ranks equal to ``MPI_COMM_WORLD``'s). ``None`` reads
    ``$NDIST_TORCH_ENGINE``, default ``"socket"``. ``transport``: the socket
    engine's ``"auto"`` / ``"tcp"`` / ``"shm"`` (``None``: ``$NDIST_TRANSPORT``).
    """

    engine: str | None = None
    transport: str | None = None

    def __post_init__(self) -> None:
        if self.engine is not None and self.engine not in ENGINES:
            raise ValueError(f"engine: expected one of {list(ENGINES)}, got {self.engine!r}")
        if self.transport is not None and self.transport not in ("auto", "tcp", "shm"):
            raise ValueError(f"transport: expected 'auto', 'tcp' or 'shm', got {self.transport!r}")

    def resolved_engine(self) -> str:
        if self.engine is not None:
            return self.engine
        engine = os.environ.get(ENGINE_ENV, "socket").strip().lower() or "socket"
        if engine not in ENGINES:
            raise ValueError(f"{ENGINE_ENV}: expected one of {list(ENGINES)}, got {engine!r}")
        return engine


def create(dist_opts: Any, pg_options: Any = None) -> Any:
    """torch's creator for backend ``"ndist"`` (``extended_api=True``)."""
    if pg_options is None:
        pg_options = Options()
    if not isinstance(pg_options, Options):
        raise TypeError(f"pg_options: expected ndist.torch.Options or None, got {type(pg_options).__name__}")
    engine = pg_options.resolved_engine()
    store = TorchStore(dist_opts.store, dist_opts.timeout)
    _secret.agree(store)
    # the default group (init_process_group: torch has none yet): every member watched
    # from here on, before any data link (``_watch``)
    default = not tdist.is_initialized()
    if default:
        _watch.start(store, dist_opts.group_rank, dist_opts.group_size, dist_opts.timeout.total_seconds())
    pg = ProcessGroupNdist(
        store, dist_opts.group_rank, dist_opts.group_size, dist_opts.timeout, str(dist_opts.group_id),
        list(dist_opts.global_ranks_in_group), engine, pg_options,
    )
    _watch.adopt(pg.ndist_group, list(dist_opts.global_ranks_in_group), default=default)
    # compiled backend (issue 43): the C++ c10d::Backend over pg where it builds and
    # $NDIST_TORCH_COMPILED allows, else pg itself (ndist/torch/_compiled.py)
    compiled = _compiled.wrap(pg, dist_opts)
    if compiled is None:
        return pg
    if _only_backend(sys._getframe(1)):  # the group itself, named "ndist" (torch takes a ProcessGroup as is)
        return _compiled.as_group(dist_opts.store, dist_opts.group_rank, dist_opts.group_size, compiled)
    return compiled  # ("cpu:ndist,cuda:nccl": a backend of torch's group, beside the other device's)


def _only_backend(caller: Any) -> bool:
    """Whether torch's ``_new_process_group_helper`` (``caller``, the frame that called
    ``create``) makes a group whose every device is on backend "ndist" (its ``backend_config``);
    False where that cannot be told (torch then builds its own group around the backend)."""
    config = caller.f_locals.get("backend_config")
    try:
        return set(config.get_device_backend_map().values()) == {BACKEND_NAME}
    except AttributeError:
        return False


def register() -> None:
    """Register backend ``"ndist"`` with torch.distributed for CPU tensors, and the
    ``ndist://`` rendezvous (once)."""
    with _lock:
        if hasattr(tdist.Backend, BACKEND_NAME.upper()):
            return
        tdist.Backend.register_backend(BACKEND_NAME, create, extended_api=True, devices=["cpu"])
        _rendezvous.register()
        _shrink.install()
