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

import logging
import os
import sys
import threading
import warnings
from dataclasses import InitVar, dataclass
from typing import Any

import torch.distributed as tdist

from ._group import BACKEND_NAME, ProcessGroupNdist
from . import _compiled, _rendezvous, _secret, _shrink, _watch
from ._store import TorchStore

log = logging.getLogger("ndist.torch")

__all__ = ["Options", "create", "register", "BACKEND_ENV", "OLD_BACKEND_ENV", "BACKENDS"]

#: picks ndist's backend under torch's backend "ndist" when no ``pg_options`` name one
#: (``socket`` or ``mpi``)
BACKEND_ENV = "NDIST_TORCH_BACKEND"
#: the variable's name before "engine" became the socket backend's word alone (native or
#: Python engine): still read when ``NDIST_TORCH_BACKEND`` is unset, with one deprecation
#: line in the log
OLD_BACKEND_ENV = "NDIST_TORCH_ENGINE"
BACKENDS = ("socket", "mpi")

_lock = threading.Lock()
_told_old: list = []


@dataclass(frozen=True)
class Options:
    """``pg_options`` for backend ``"ndist"``.

    ``backend``: ndist's backend underneath, ``"socket"`` (shared memory on one
    host, TCP across hosts) or ``"mpi"`` (mpi4py; run under ``mpiexec``, with
    torch's global ranks equal to ``MPI_COMM_WORLD``'s). ``None`` reads
    ``$NDIST_TORCH_BACKEND``, default ``"socket"``. ``transport``: the socket
    backend's ``"auto"`` / ``"tcp"`` / ``"shm"`` (``None``: ``$NDIST_TRANSPORT``).
    ``engine`` is ``backend``'s old name: still accepted, with a ``DeprecationWarning``.
    """

    backend: str | None = None
    transport: str | None = None
    engine: InitVar[str | None] = None

    def __post_init__(self, engine: str | None) -> None:
        if engine is not None:
            warnings.warn("ndist.torch.Options(engine=...) is deprecated: use backend=... (same meaning)",
                          DeprecationWarning, stacklevel=3)
            if self.backend is not None and self.backend != engine:
                raise ValueError(f"engine: the old name of backend, expected it unset or equal to "
                                 f"backend={self.backend!r}, got {engine!r}")
            object.__setattr__(self, "backend", engine)
        if self.backend is not None and self.backend not in BACKENDS:
            raise ValueError(f"backend: expected one of {list(BACKENDS)}, got {self.backend!r}")
        if self.transport is not None and self.transport not in ("auto", "tcp", "shm"):
            raise ValueError(f"transport: expected 'auto', 'tcp' or 'shm', got {self.transport!r}")

    def resolved_backend(self) -> str:
        """``backend``, else ``$NDIST_TORCH_BACKEND`` (else its old name,
        ``$NDIST_TORCH_ENGINE``), else ``"socket"``."""
        if self.backend is not None:
            return self.backend
        name, raw = BACKEND_ENV, os.environ.get(BACKEND_ENV)
        if raw is None and os.environ.get(OLD_BACKEND_ENV) is not None:
            name, raw = OLD_BACKEND_ENV, os.environ[OLD_BACKEND_ENV]
            if not _told_old:
                _told_old.append(True)
                log.warning("%s is deprecated: set %s instead (same meaning)", OLD_BACKEND_ENV, BACKEND_ENV)
        backend = (raw or "").strip().lower() or "socket"
        if backend not in BACKENDS:
            raise ValueError(f"{name}: expected one of {list(BACKENDS)}, got {backend!r}")
        return backend


def create(dist_opts: Any, pg_options: Any = None) -> Any:
    """torch's creator for backend ``"ndist"`` (``extended_api=True``)."""
    if pg_options is None:
        pg_options = Options()
    if not isinstance(pg_options, Options):
        raise TypeError(f"pg_options: expected ndist.torch.Options or None, got {type(pg_options).__name__}")
    backend = pg_options.resolved_backend()
    store = TorchStore(dist_opts.store, dist_opts.timeout)
    _secret.agree(store)
    # the default group (init_process_group: torch has none yet): every member watched
    # from here on, before any data link (``_watch``)
    default = not tdist.is_initialized()
    if default:
        _watch.start(store, dist_opts.group_rank, dist_opts.group_size, dist_opts.timeout.total_seconds())
    pg = ProcessGroupNdist(
        store, dist_opts.group_rank, dist_opts.group_size, dist_opts.timeout, str(dist_opts.group_id),
        list(dist_opts.global_ranks_in_group), backend, pg_options,
        numbering=_rendezvous.numbering(),  # (after a grow: a new numbering of the job's processes)
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
