"""The backend registry: backends are found by name, never imported by runtime.

A backend registers a factory under a name (``"socket"``, ``"mpi"``,
``"nccl"``), the device types it serves and a cheap availability probe. The
factory may be given as ``"package.module:attr"`` so that registering costs no
import; it is resolved on first use. The built-in backends are a table of such
entries in ``ndist.collectives.backends``, registered when ``ndist.collectives``
is imported (every facade imports it: ``ndist.distributed`` first of all), so
this module never names a layer above it. Third-party backends can also
register through the ``ndist.backends`` entry-point group (value ``module:attr``
of a callable that performs the registration).
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable

__all__ = ["BackendContext", "BackendSpec", "register_backend", "get_backend_spec", "registered_backends",
           "is_registered"]


@dataclass(frozen=True)
class BackendContext:
    """What a backend factory receives to build one backend for one group.

    ``store`` is already prefixed for this group and backend; ``rank`` and
    ``size`` are the rank in the group and its size; ``global_ranks[i]`` is
    the global rank of group rank ``i``; ``device`` is the device type
    (``"cpu"`` or ``"cuda"``) this instance serves; ``device_index`` is the
    CUDA ordinal a ``"cuda"`` backend uses (the bound ``device_id``, else the
    rank's current / launch-default device; None without a GPU).
    ``report_loss(global_rank, host, message)``: a backend that finds a member lost
    first (a connection closed mid-op) tells the group with it, so every later op
    on the group fails at once (``ProcessGroup.note_loss``). ``numbering`` names the
    global ranks' numbering: it changes when the default group is shrunk (global
    rank 2 is then another process), so process-wide records keyed by global rank
    must include it.
    """

    store: Any
    rank: int
    size: int
    timeout: timedelta
    group_name: str
    global_ranks: tuple[int, ...]
    device: str
    options: Any = None
    device_index: int | None = None
    report_loss: Callable[[int, Any, str], None] | None = None
    numbering: str = ""


Factory = Callable[[BackendContext], Any]


@dataclass
class BackendSpec:
    name: str
    factory: Factory | str
    devices: tuple[str, ...]
    is_available: Callable[[], bool] | str | None = None
    needs_store: bool = True
    #: why ``shrink_group`` cannot shrink a group on this backend (``() -> str``, found
    #: at run time: what the library lacks); None: the generic reason
    shrink_refusal: Callable[[], str] | str | None = None
    _resolved: dict = field(default_factory=dict, repr=False)

    def _resolve(self, attr: str) -> Any:
        value = getattr(self, attr)
        if isinstance(value, str):
            if attr not in self._resolved:
                module, _, name = value.partition(":")
                self._resolved[attr] = getattr(importlib.import_module(module), name)
            return self._resolved[attr]
        return value

    def create(self, ctx: BackendContext) -> Any:
        return self._resolve("factory")(ctx)

    def available(self) -> bool:
        probe = self._resolve("is_available")
        if probe is None:
            return True
        try:
            return bool(probe())
        except Exception:  # noqa: BLE001 - an availability probe must not raise
            return False

    def why_no_shrink(self) -> str:
        """Why this backend cannot shrink a group (its ``shrink_refusal``, or a generic reason)."""
        generic = f"ndist's {self.name} backend does not support shrinking yet (docs/errors.md, 'Rank loss')"
        if self.shrink_refusal is None:
            return generic
        try:
            return str(self._resolve("shrink_refusal")())
        except Exception as err:  # noqa: BLE001 - the refusal must still be raised
            return f"{generic} (finding out why failed: {type(err).__name__}: {err})"


_lock = threading.Lock()
_specs: dict[str, BackendSpec] = {}
_entry_points_loaded = False


def register_backend(
    name: str,
    factory: Factory | str,
    devices: tuple[str, ...] | list[str] = ("cpu",),
    is_available: Callable[[], bool] | str | None = None,
    needs_store: bool = True,
    shrink_refusal: Callable[[], str] | str | None = None,
) -> None:
    """Register backend ``name`` (lower-cased) serving ``devices``. ``shrink_refusal``: for a
    backend that cannot shrink, a callable (or ``"module:attr"``) saying why, at run time."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: expected a non-empty string, got {name!r}")
    devices = tuple(devices)
    for dev in devices:
        if dev not in ("cpu", "cuda"):
            raise ValueError(f"devices: expected 'cpu' and/or 'cuda', got {dev!r}")
    with _lock:
        _specs[name.lower()] = BackendSpec(name.lower(), factory, devices, is_available, needs_store,
                                         shrink_refusal)


def _load_entry_points() -> None:
    """Built-ins, then the ``ndist.backends`` entry points of installed plugins.

    Scanning the installed distributions costs tens of milliseconds at start-up
    (``importlib.metadata``), so lookups of a built-in name never do it: only
    an unknown name or the full list (``registered_backends``) loads plugins.
    """
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    try:
        from importlib.metadata import entry_points

        for ep in entry_points(group="ndist.backends"):
            ep.load()()
    except Exception:  # noqa: BLE001 - a broken plugin must not break ndist
        import logging

        logging.getLogger("ndist.runtime").warning("failed to load ndist.backends entry points", exc_info=True)


def is_registered(name: str) -> bool:
    """Whether backend ``name`` is registered (plugins are loaded only if it is not a built-in)."""
    key = name.lower()
    if key not in _specs:
        _load_entry_points()
    return key in _specs


def get_backend_spec(name: str) -> BackendSpec:
    key = name.lower()
    is_registered(key)
    try:
        return _specs[key]
    except KeyError:
        raise ValueError(
            f"backend: unknown backend {name!r}; registered: {registered_backends()}"
        ) from None


def registered_backends() -> list[str]:
    _load_entry_points()
    return sorted(_specs)
