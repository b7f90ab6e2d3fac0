"""The compiled backend: a C++ ``c10d::Backend`` over ``ProcessGroupNdist``, and the custom ops.

``csrc/ndist_backend.cpp`` (package data) is built against the installed torch with
``torch.utils.cpp_extension.load`` the first time it is needed, once per torch version,
ndist version, Python and source (the module's name carries their hash), into
``$TORCH_EXTENSIONS_DIR`` (else torch's per-user cache, ``~/.cache/torch_extensions``);
later processes import the cached module (without torch's check, which would hash the sources
and run ninja in every process). While it compiles, one WARNING on ``ndist.torch``
says so (shown without any logging set up: a first group then takes a minute or two). Where
it cannot be built (no C++ compiler, no ninja, no torch headers), the Python backend serves,
after one WARNING. torch 2.13's build lock (``<build dir>/lock``, which a build killed
midway leaves behind, and on which torch's next build would wait forever; 2.14 locks it with
an advisory lock instead) is handled under a lock of ndist's own (``flock`` on ``<build dir>.ndist-lock``, released by the kernel when its
holder dies): whoever holds it finds no live build behind torch's lock file, and removes it.
A killed build's ninja and compilers do not hold that lock (torch starts ninja with its file
descriptors closed) and may still run in the folder: the next build waits for them first
(``_wait_for_leftovers``).

``$NDIST_TORCH_COMPILED`` picks: ``auto`` (the default, ``DEFAULT``: the compiled backend where
it builds), ``1`` (it must: a failed build raises), ``0`` (the Python backend only).

The C++ side calls back into this module (with the GIL) for what stays Python:
``engine_handle`` (the engine's handle of a group, once it has one), ``failed_work`` and
``raise_engine_error`` (an engine failure as the Python backend reports it).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import logging
import os
import shlex
import sys
import threading
import time
from typing import Any

import torch

from .. import __version__ as _ndist_version
from ..collectives import engine_handle as _engine_handle, engine_include_dir
from ..runtime import (DistBackendError, DistError, DistMismatchError, DistNetworkError, DistRankFailureError,
                       DistStoreError, DistTimeoutError)
from ._work import NdistWork, as_torch_error

__all__ = ["COMPILED_ENV", "MODES", "DEFAULT", "mode", "load", "loaded", "wrap", "wrap_group", "as_group", "backend_group",
           "python_group", "build_directory", "engine_handle", "failed_work", "raise_engine_error"]

log = logging.getLogger("ndist.torch")

#: picks the backend torch gets: ``auto``, ``1`` or ``0``
COMPILED_ENV = "NDIST_TORCH_COMPILED"
MODES = ("auto", "1", "0")
#: the compiled backend where it builds, else the Python backend after one WARNING
DEFAULT = "auto"

#: how long a build waits for the processes a killed build left running in its folder
LEFTOVER_WAIT_S = 600.0

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "ndist_backend.cpp")
_lock = threading.Lock()
_tried = False
_module: Any = None


def mode() -> str:
    """``$NDIST_TORCH_COMPILED`` (``DEFAULT`` when unset); ValueError naming it otherwise."""
    value = os.environ.get(COMPILED_ENV, DEFAULT).strip().lower() or DEFAULT
    if value not in MODES:
        raise ValueError(f"{COMPILED_ENV}: expected one of {list(MODES)}, got {value!r}")
    return value


def _name() -> str:
    """The module's name: a hash of what its binary depends on, so a cache shared by several
    torch or ndist installs never hands one the other's build."""
    h = hashlib.sha256()
    for path in (_SOURCE, os.path.join(engine_include_dir(), "ndist_engine.h")):
        with open(path, "rb") as f:
            h.update(f.read())
    h.update(f"{torch.__version__}|{_ndist_version}|{sys.version}|{_flags()}".encode())
    return f"ndist_torch_{h.hexdigest()[:16]}"


def _flags() -> tuple[list[str], list[str]]:
    """Compiler and linker flags added by ``$NDIST_TORCH_CFLAGS`` / ``$NDIST_TORCH_LDFLAGS`` (the
    sanitizer build in docs/native.md); part of the module's name, so such a build is cached apart."""
    return (shlex.split(os.environ.get("NDIST_TORCH_CFLAGS", "")),
            shlex.split(os.environ.get("NDIST_TORCH_LDFLAGS", "")))


def build_directory(name: str) -> str:
    """Where the module ``name`` is built and cached: ``$TORCH_EXTENSIONS_DIR/<name>``, else
    under torch's per-user default root."""
    from torch.utils import cpp_extension

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    return os.path.join(root, name)


def load() -> Any:
    """The compiled module (building it the first time), or None where it cannot be built
    (one WARNING per process); with ``$NDIST_TORCH_COMPILED=1`` a failed build raises
    RuntimeError. Loading it registers ``torch.ops.ndist.*``."""
    global _tried, _module
    with _lock:
        if _tried:
            return _module
        forced = mode() == "1"
        try:
            _module = _build()
        except Exception as exc:  # noqa: BLE001 - any failure to build means the Python backend
            if forced:
                _tried = True
                raise RuntimeError(f"{COMPILED_ENV}=1: ndist's compiled torch backend could not be built: "
                                   f"{type(exc).__name__}: {exc}") from exc
            log.warning("ndist's compiled torch backend could not be built (%s: %s); using the Python backend "
                        "(set %s=0 to skip the attempt)", type(exc).__name__, _first_line(exc), COMPILED_ENV)
            _module = None
        _tried = True
        return _module


def loaded() -> Any:
    """The compiled module if this process loaded it, else None (never builds)."""
    return _module


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def _build() -> Any:
    from torch.utils import cpp_extension

    name = _name()
    directory = build_directory(name)
    os.makedirs(directory, exist_ok=True)
    library = os.path.join(directory, f"{name}.so")
    with open(directory + ".ndist-lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # (one build or load at a time; released when this process dies)
        if os.path.exists(library):
            # built before (the name is the hash of all it depends on): imported as is, without
            # torch's check, which hashes the sources and runs ninja again in every process
            try:
                return _import(name, library)
            except ImportError as exc:  # a link killed midway: built again
                log.warning("%s could not be loaded (%s); building it again", library, exc)
                os.unlink(library)
        _wait_for_leftovers(directory)
        _remove_stale_lock(directory)
        log.warning("compiling ndist's torch backend %s for torch %s into %s (once per torch and ndist "
                    "version: a minute or two)", name, torch.__version__, directory)
        cflags, ldflags = _flags()
        return cpp_extension.load(name=name, sources=[_SOURCE], extra_include_paths=[engine_include_dir()],
                                  extra_cflags=["-O2", *cflags], extra_ldflags=ldflags, build_directory=directory,
                                  verbose=False)


def _import(name: str, library: str) -> Any:
    """The extension module ``name`` from ``library`` (what cpp_extension.load ends with)."""
    spec = importlib.util.spec_from_file_location(name, library)
    if spec is None or spec.loader is None:
        raise ImportError(f"{library}: not an extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _workers(directory: str) -> list:
    """The processes that work in ``directory`` now, as ``"pid (name)"``: their working
    directory is it or under it (torch runs ninja there, and ninja its compilers and linker),
    this process and its ancestors left out (a user may start Python from there)."""
    real = os.path.realpath(directory)
    mine, pid = set(), os.getpid()
    while pid > 1 and pid not in mine:  # (this process and its ancestors)
        mine.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:  # no /proc: nothing to tell
        return []
    found = []
    for pid in pids:
        if pid in mine:
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
        except OSError:  # gone, or not ours to read
            continue
        if cwd == real or cwd.startswith(real + os.sep):
            found.append(f"{pid} ({name})")
    return found


def _wait_for_leftovers(directory: str, timeout: float = LEFTOVER_WAIT_S) -> None:
    """Wait, under ndist's lock, until no process works in ``directory``: no build of ours is
    alive there, but one killed midway leaves its ninja and compilers running (torch starts
    ninja with the other file descriptors closed, so they do not hold ndist's lock), and a build
    beside them would compile and link into the same files. RuntimeError naming them after
    ``timeout`` seconds (under ``auto``: the Python backend, after the one warning)."""
    left = _workers(directory)
    if not left:
        return
    log.warning("waiting for %s, left running in %s by a build of ndist's torch backend that did not finish",
                ", ".join(left), directory)
    deadline = time.monotonic() + timeout
    while left:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{directory}: {', '.join(left)} still work there after {timeout:.0f} s "
                               "(left by a build of ndist's torch backend that did not finish?)")
        time.sleep(0.2)
        left = _workers(directory)


def _remove_stale_lock(directory: str) -> None:
    """Remove torch's build lock (``FileBaton``'s ``lock``, torch 2.13) in ``directory``, under
    ndist's lock and once no process works there (``_wait_for_leftovers``): every build there
    runs under that lock, so none is alive behind this file (a build killed midway left it, and
    torch's next build would wait on it forever). torch 2.14
    locks that file with an advisory lock instead (its ``FileLock``), which the kernel
    releases: the file stays, and is no sign of a killed build."""
    from torch.utils import cpp_extension

    if not hasattr(cpp_extension, "FileBaton"):
        return
    stale = os.path.join(directory, "lock")
    try:
        os.unlink(stale)
    except FileNotFoundError:
        return
    log.warning("removed %s, left by a build of ndist's torch backend that did not finish", stale)


def wrap(pg: Any, dist_opts: Any) -> Any:
    """The compiled backend over the Python group ``pg`` (what ``create`` gives torch), or
    None: switched off, an ndist backend the engine's C interface does not serve (``mpi``), or not built."""
    if mode() == "0" or pg.ndist_backend != "socket":
        return None
    module = load()
    if module is None:
        return None
    return module.create_backend(pg, dist_opts.group_rank, dist_opts.group_size)


def as_group(store: Any, rank: int, size: int, backend: Any) -> Any:
    """torch's group for a compiled ``backend`` that is the group's only one: a torch
    ``ProcessGroup`` whose ``getBackendName()`` is ``"ndist"`` (torch's own group of a custom C++
    backend says ``"custom"``, which DDP's logging reports), the backend registered for cpu."""
    return _module.create_group(store, rank, size, backend)


def wrap_group(pg: Any) -> Any:
    """A compiled backend over the Python group ``pg`` (the module is loaded: ``pg`` is a
    compiled backend's shrunk group)."""
    return _module.create_backend(pg, pg.rank(), pg.size())


def backend_group(backend: Any) -> Any:
    """The ``ProcessGroupNdist`` under a compiled backend (a torch ``Backend``), else None."""
    if _module is None:
        return None
    try:
        return _module.python_group(backend)
    except TypeError:
        return None


def python_group(pg: Any) -> Any:
    """The ``ProcessGroupNdist`` behind torch group ``pg``: ``pg`` itself (the Python backend),
    its compiled backend's (torch's own group with that backend for cpu), else None."""
    if hasattr(pg, "ndist_group"):
        return pg
    try:
        backend = pg._get_backend(torch.device("cpu"))
    except (RuntimeError, AttributeError):
        return None
    return backend_group(backend)


# ------------------------------------------------------------------ called from C++
def engine_handle(pg: Any) -> int:
    """The engine's handle of the Python group ``pg``: 0 while it has none yet (no
    collective ran), -1 if it never will (the Python engine, a broken or destroyed group:
    its ops stay the Python group's)."""
    group = pg.ndist_group
    lane = group.lanes.get("cpu")
    if lane is None:
        return -1 if group.revoked else 0
    if getattr(lane.backend, "_eng", True) is None:  # the socket backend's set-up still in flight (an async op)
        return 0
    try:
        return _engine_handle(group)
    except (ValueError, DistError):
        return -1


_CLASSES = {cls.__name__: cls for cls in (DistError, DistBackendError, DistNetworkError, DistRankFailureError,
                                          DistStoreError, DistTimeoutError, DistMismatchError)}


def _engine_error(type_name: str, rank: int, message: str, pg: Any = None) -> BaseException:
    """ndist's exception for an engine failure (``ndist_error``'s class name, rank, message) on
    the Python group ``pg``: a ``DistRankFailureError`` takes the lost members (``failed_ranks``,
    ``hosts``, ``causes``) from the group's record, as the Python path's does."""
    if type_name == "KeyboardInterrupt":
        return KeyboardInterrupt(message)
    cls = _CLASSES.get(type_name, DistBackendError)
    if cls is DistRankFailureError and pg is not None:
        known = pg.ndist_group.failure()
        if known is not None:
            return DistRankFailureError(message, failed_ranks=known.failed_ranks, hosts=known.hosts,
                                        causes=known.causes, rank=rank if rank >= 0 else known.rank,
                                        host=known.host)
    if issubclass(cls, DistNetworkError):
        return cls(message, rank=rank if rank >= 0 else None)
    return cls(message)


def failed_work(pg: Any, outputs: list, op: str, type_name: str, rank: int, message: str) -> NdistWork:
    """The failed Work the Python backend returns for the same failure (``wait()`` raises it)."""
    return NdistWork((), list(outputs), pg._nd_timeout, op, error=_engine_error(type_name, rank, message, pg))


def raise_engine_error(type_name: str, rank: int, message: str, pg: Any = None) -> None:
    """Raise torch's error for an engine failure (a custom op's on the Python group ``pg``):
    what ``wait()`` raises on the Python backend."""
    raise as_torch_error(_engine_error(type_name, rank, message, pg))

