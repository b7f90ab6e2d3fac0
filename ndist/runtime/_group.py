"""ProcessGroup: a set of global ranks, its store, and its backends per device type.

A ProcessGroup is small on purpose: membership and rank translation, the
group's store (already prefixed with the group's name) and the backends,
created lazily on first use from the backend registry. Non-members get a
group object too (``rank() == -1``), so every rank can call ``new_group``
in the same order as torch requires; using it raises ``ValueError``.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any, Callable, Mapping

from ._errors import EXITED, LEFT, DistBackendError, DistMismatchError, DistRankFailureError
from ._device import backend_device_index
from ._registry import BackendContext, get_backend_spec, is_registered, registered_backends
from .store import PrefixStore, Store

__all__ = ["ProcessGroup", "Backend", "parse_backend", "format_backend", "require_available", "DEVICE_TYPES"]

log = logging.getLogger("ndist.runtime.group")

DEVICE_TYPES = ("cpu", "cuda")
_ALIASES = {"gloo": "socket"}  # ported torch code says gloo; our CPU backend is socket
# What a built-in backend needs that a plain ``pip install ndist`` does not bring.
_NEEDS = {
    "mpi": "mpi4py and an MPI library (pip install 'ndist[mpi]' installs mpi4py and MPICH)",
    "nccl": "CuPy with NCCL and a CUDA GPU (pip install 'ndist[cuda]')",
}


class Backend(str):
    """Backend names, as ``torch.distributed.Backend`` (a validated, lower-case str)."""

    UNDEFINED = "undefined"
    SOCKET = "socket"
    GLOO = "gloo"
    MPI = "mpi"
    NCCL = "nccl"

    def __new__(cls, name: str):
        if not isinstance(name, str):
            raise TypeError(f"backend: expected str, got {type(name).__name__}")
        value = name.lower()
        if value != cls.UNDEFINED and ":" not in value and not is_registered(_ALIASES.get(value, value)):
            raise ValueError(f"backend: unknown backend {name!r}; registered: {registered_backends()} (and 'gloo')")
        return super().__new__(cls, value)

    @staticmethod
    def register_backend(name: str, func, devices=("cpu",), is_available=None, needs_store: bool = True) -> None:
        """Register a third-party backend (see ``ndist.runtime.register_backend``)."""
        from ._registry import register_backend

        register_backend(name, func, devices=devices, is_available=is_available, needs_store=needs_store)


def _canonical(name: str) -> str:
    """``gloo`` is looked up as itself when registered (so ``get_backend()`` says
    "gloo" to ported torch code), else as its alias ``socket``."""
    if name in _ALIASES and not is_registered(name):
        return _ALIASES[name]
    return name


def parse_backend(backend: str, default_devices: Mapping[str, str] | None = None) -> dict[str, str]:
    """``"socket"`` / ``"cpu:socket,cuda:nccl"`` -> ``{"cpu": "socket", "cuda": "nccl"}``.

    A plain name serves every device type its registration lists. Unknown
    names and device types are ``ValueError`` naming what is registered.
    """
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected str or None, got {type(backend).__name__}")
    text = backend.strip().lower()
    if not text:
        raise ValueError("backend: expected a backend name such as 'socket', got ''")
    result: dict[str, str] = {}
    if ":" not in text:
        name = _canonical(text)
        spec = get_backend_spec(name)  # ValueError listing registered backends
        for dev in spec.devices:
            result[dev] = name
        return result
    for part in text.split(","):
        dev, sep, name = (p.strip() for p in part.partition(":"))
        if not sep or dev not in DEVICE_TYPES or not name:
            raise ValueError(
                f"backend: expected 'device:name' pairs like 'cpu:socket,cuda:nccl', got {backend!r}"
            )
        name = _canonical(name)
        spec = get_backend_spec(name)
        if dev not in spec.devices:
            raise ValueError(f"backend: {name!r} does not serve {dev!r} devices (it serves {list(spec.devices)})")
        if dev in result:
            raise ValueError(f"backend: device {dev!r} named twice in {backend!r}")
        result[dev] = name
    return result


def unavailable_message(name: str, where: str) -> str:
    """Why backend ``name`` cannot run here and what to install, for ``DistBackendError``."""
    needs = _NEEDS.get(name)
    why = f"it needs {needs}" if needs else "its availability check failed"
    return f"{where}: backend {name!r} cannot run on this machine: {why}"


def require_available(mapping: Mapping[str, str], where: str) -> None:
    """``DistBackendError`` (what to install) if a backend of ``mapping`` cannot run here.

    Called when a group is created (``init_process_group``, ``new_group``), before any
    communication, so that a missing package is reported there rather than at the first
    collective; torch fails at init too.
    """
    for dev in DEVICE_TYPES:
        name = mapping.get(dev)
        if name is not None and not get_backend_spec(name).available():
            raise DistBackendError(unavailable_message(name, f"{where} ({dev} tensors)"))


def format_backend(mapping: Mapping[str, str]) -> str:
    names = set(mapping.values())
    if len(names) == 1:
        return next(iter(names))
    return ",".join(f"{d}:{mapping[d]}" for d in DEVICE_TYPES if d in mapping)


class ProcessGroup:
    """A group of global ranks (see docs/architecture.md for the contract)."""

    def __init__(
        self,
        ranks: tuple[int, ...],
        my_global_rank: int,
        group_name: str,
        store: Store,
        backends: Mapping[str, str],
        timeout: timedelta,
        options: Any = None,
    ) -> None:
        self.ranks: tuple[int, ...] = tuple(ranks)
        self.group_name = group_name
        self.timeout = timeout
        self.options = options
        self.device_id: int | None = None  # init_process_group(device_id=...), as torch's bound device
        self.group_desc = ""
        self._global_rank = my_global_rank
        self._index = {r: i for i, r in enumerate(self.ranks)}
        self._rank = self._index.get(my_global_rank, -1)
        self._store = store
        self._backend_names = dict(backends)
        self._backends: dict[str, Any] = {}
        #: per device type, what the layer above keeps for its repeated-call path (the
        #: collectives' lane: backend, flight recorder, sequence counter). Filled by that
        #: layer once the backend exists, emptied when the group is destroyed, so an entry
        #: found here belongs to a live group this process is a member of.
        self.lanes: dict[str, Any] = {}
        #: the repeated call's fast exit on the CPU (docs/architecture.md, "One call, by hand"):
        #: that layer's object over the CPU lane, set and emptied with ``lanes``
        self.fast: Any = None
        self._lock = threading.Lock()
        #: how an op that lost its connection to a global rank waits for the member watch's
        #: verdict on it (``(global_rank, grace, timeout) -> bool``, as ``_World.await_loss``);
        #: None: the job's watch (``init_process_group``'s). torch's groups have their own
        #: watch (``ndist.torch._watch``), which sets this.
        self.loss_verdict: Callable[[int, float, float], bool] | None = None
        #: the members whose process the member watch saw go (died, exited, left): global
        #: rank -> (host, cause, detail), never a member a backend merely lost a connection
        #: to (that one may be alive); what ``shrink_group``'s agreement counts as lost.
        #: None: the job's watch (``_World.lost``); torch's groups have their own watch
        #: (``ndist.torch._watch``), which sets this.
        self.watched_losses: Callable[[], dict[int, tuple[str, str, str]]] | None = None
        self._destroyed = False
        self._claimed = False
        #: lost members: global rank -> (host, cause, detail); non-empty: the group is revoked
        self._failed: dict[int, tuple[str, str, str]] = {}
        #: revoked for a process outside the group (``revoke_for``): (global rank, host,
        #: cause, detail, why); None otherwise
        self._outside: tuple[int, str, str, str, str] | None = None
        self._revoked = False
        #: the global ranks' numbering this group's ranks are in (``BackendContext.numbering``)
        self.numbering = ""

    # ------------------------------------------------------------ membership
    def rank(self) -> int:
        """This process's rank in the group, -1 if it is not a member."""
        return self._rank

    def size(self) -> int:
        return len(self.ranks)

    @property
    def is_member(self) -> bool:
        return self._rank >= 0

    @property
    def destroyed(self) -> bool:
        return self._destroyed

    def require_member(self, what: str = "this operation") -> None:
        self.require_alive()
        if not self.is_member:
            raise ValueError(
                f"group: global rank {self._global_rank} is not a member of group {self.group_name!r} "
                f"with ranks {list(self.ranks)}; {what} must be called by its members only"
            )

    def require_alive(self) -> None:
        if self._destroyed:
            raise ValueError(f"group: process group {self.group_name!r} has been destroyed")

    # ------------------------------------------------------------ failure
    def note_loss(self, global_rank: int, host: str, cause: str, detail: str = "") -> None:
        """Member ``global_rank`` is lost (``cause``: died, exited, left, or lost: a
        backend found its connection gone mid-op). Any thread.

        A member that **died**, or was lost mid-op, revokes the group: every later
        operation on it raises the same ``DistRankFailureError`` at once (the layer above
        forgets its lanes, so its next call comes through ``backend_for``, which raises),
        and the backends are told (``member_lost``), so an operation that waits on it, or
        on a survivor that will stop for it, fails now instead of at the timeout. A member
        that **exited** or **left** (destroy_process_group) finished what it had started:
        what it sent is still delivered, so the backends are told only that it is gone
        (``member_departed``: a connection to it, or a wait for it, fails at once, naming
        it); the first operation that fails for it revokes the group."""
        if global_rank not in self._index:
            return
        revoke = cause not in (EXITED, LEFT)
        with self._lock:
            if self._destroyed:
                return
            known = global_rank in self._failed
            if not known:
                self._failed[global_rank] = (str(host), cause, detail)
            newly = revoke and not self._revoked
            if newly:
                self._revoked = True
                self.lanes = {}
                self.fast = None
            if known and not newly:
                return
            backends = list(self._backends.values())
        if known:  # a departed member's loss, now found by an operation: nothing new to tell
            return
        message = f"rank {global_rank} ({host}) {cause}" + (f": {detail}" if detail else "")
        log.info("group %r: %s", self.group_name, message)
        method = "member_lost" if revoke else "member_departed"
        for backend in backends:
            hook = getattr(backend, method, None)
            if hook is not None:
                try:
                    hook(global_rank, host, message)
                except Exception:  # noqa: BLE001 - the loss is recorded; a backend must not hide it
                    log.warning("group %r: telling the backend of rank %d's loss failed", self.group_name,
                                global_rank, exc_info=True)

    def revoke_for(self, global_rank: int, host: str, cause: str, detail: str, why: str) -> None:
        """Revoke this group for the loss of global rank ``global_rank``, a process that
        need not be a member: the group is aborted because ``why`` (e.g. a member began
        ``shrink_group`` on the default group, which destroys every other group). Any
        thread. Every pending and later operation on it raises the group's
        ``DistRankFailureError`` (``failed_ranks`` [] when no member is lost, ``rank`` /
        ``host`` naming ``global_rank``), as for a member's death: the layer above
        forgets its lanes, and each backend's ``group_revoked(global_rank, host,
        message)`` (optional) fails what waits, here and, through its own notices, on
        the peers that wait on this rank. Nothing if the group is revoked already."""
        with self._lock:
            if self._destroyed or self._revoked:
                return
            self._outside = (global_rank, str(host), cause, detail, why)
            self._revoked = True
            self.lanes = {}
            self.fast = None
            backends = list(self._backends.values())
        message = why  # (a backend's error names the rank and host first)
        log.info("group %r aborted: rank %d (%s) %s%s; %s", self.group_name, global_rank, host, cause,
                 f": {detail}" if detail else "", why)
        for backend in backends:
            hook = getattr(backend, "group_revoked", None)
            if hook is not None:
                try:
                    hook(global_rank, host, message)
                except Exception:  # noqa: BLE001 - the group is revoked; a backend must not hide it
                    log.warning("group %r: telling the backend that the group is aborted failed", self.group_name,
                                exc_info=True)

    def note_kept(self, global_ranks) -> None:
        """The survivors of a shrink of this group kept ``global_ranks``: a backend that
        recorded one of them lost (a connection failed; its watch never saw it go) forgets
        that (``members_kept``, optional), so the shrunk group connects to it again."""
        with self._lock:
            backends = list(self._backends.values())
        for backend in backends:
            hook = getattr(backend, "members_kept", None)
            if hook is not None:
                try:
                    hook(list(global_ranks))
                except Exception:  # noqa: BLE001 - the shrink goes on; the new group finds out itself
                    log.warning("group %r: telling the backend of the kept members failed", self.group_name,
                                exc_info=True)

    def _backend_lost(self, global_rank: int, host, message: str) -> None:
        """A backend of this group found ``global_rank`` lost first (its
        ``BackendContext.report_loss``): an operation failed for it. A rank outside the
        group is one a member aborted the group for (``revoke_for`` there; its backend
        told this one): this group is revoked for it too."""
        host = str(host) if host is not None else "?"
        if global_rank in self._index:
            self.note_loss(global_rank, host, "lost", message)
        else:
            self.revoke_for(global_rank, host, "lost", message, "a member aborted the group for it")

    @property
    def revoked(self) -> bool:
        """True once a lost member failed the group, or it was aborted for a process
        outside it (``revoke_for``), until it is shrunk or destroyed."""
        return self._revoked

    def failed_ranks(self) -> list[int]:
        """The group ranks of the members this group knows are lost, sorted."""
        return sorted(self._index[g] for g in list(self._failed))

    def failure(self, cause: BaseException | None = None) -> DistRankFailureError | None:
        """The error an operation on this group raises for its lost members (a new
        instance each time; None while none is known lost). ``cause``: the backend's own
        error for the operation that found the loss, whose message comes first."""
        failed = dict(self._failed)  # (in the order the losses were learnt)
        if not failed:
            return self._aborted(cause)
        order = list(failed)
        # the root cause: a member that died (exits often follow a death: the survivors
        # that learnt of it and ended), the one the operation found if several, else the
        # first learnt
        died = [g for g in order if failed[g][1] not in (EXITED, LEFT)]
        found = getattr(cause, "rank", None)
        first = found if found in (died or order) else (died or order)[0]
        parts = []
        for g in [first] + [g for g in order if g != first]:
            host, cause_word, detail = failed[g]
            parts.append(f"rank {g} ({host}) {cause_word}" + (f": {detail}" if detail else ""))
        text = (f"group {self.group_name!r} lost {'members' if len(order) > 1 else 'a member'}: {'; '.join(parts)}. "
                "The group is revoked: every operation on it fails until it is shrunk (shrink_group) or destroyed")
        if cause is not None:
            text = f"{cause}. {text}"
        granks = sorted(failed, key=self._index.__getitem__)
        return DistRankFailureError(
            text, failed_ranks=[self._index[g] for g in granks], hosts=[failed[g][0] for g in granks],
            causes=[failed[g][1] for g in granks], rank=first, host=failed[first][0])

    def _aborted(self, cause: BaseException | None) -> DistRankFailureError | None:
        """``failure`` of a group revoked for a process outside it (``revoke_for``)."""
        outside = self._outside
        if outside is None:
            return None
        grank, host, how, detail, why = outside
        text = (f"group {self.group_name!r} is aborted: rank {grank} ({host}), not a member, {how}"
                + (f": {detail}" if detail else "") + f"; {why}. The group is revoked: every operation on it fails; "
                "shrink the default group (shrink_group), which destroys this one, as torch does")
        if cause is not None:
            text = f"{cause}. {text}"
        return DistRankFailureError(text, failed_ranks=[], hosts=[], causes=[], rank=grank, host=host)

    def lost_members(self) -> dict[int, tuple[str, str, str]]:
        """The members this group knows are lost, in the order learnt: global rank ->
        (host, cause, detail)."""
        return dict(self._failed)

    def known_losses(self) -> dict[int, tuple[str, str, str]]:
        """Every loss this group knows, in the order learnt: its lost members
        (``lost_members``), and the process it was aborted for (``revoke_for``), which need
        not be a member: global rank -> (host, cause, detail)."""
        known = dict(self._failed)
        outside = self._outside
        if outside is not None:
            known.setdefault(outside[0], outside[1:4])
        return known

    def require_healthy(self) -> None:
        """Raise the group's ``DistRankFailureError`` if it is revoked."""
        if self._revoked:
            raise self.failure()

    def group_rank(self, global_rank: int) -> int:
        """The rank in this group of ``global_rank``; ValueError if it is not a member."""
        try:
            return self._index[global_rank]
        except (KeyError, TypeError):
            raise ValueError(
                f"global_rank: rank {global_rank!r} is not part of group {self.group_name!r} with ranks {list(self.ranks)}"
            ) from None

    def global_rank(self, group_rank: int) -> int:
        if not isinstance(group_rank, int) or isinstance(group_rank, bool) or not 0 <= group_rank < len(self.ranks):
            raise ValueError(
                f"group_rank: expected an int in [0, {len(self.ranks)}) for group {self.group_name!r}, got {group_rank!r}"
            )
        return self.ranks[group_rank]

    # ------------------------------------------------------------ resources
    @property
    def store(self) -> Store:
        """The group's store (keys are private to this group)."""
        return self._store

    @property
    def backend_names(self) -> dict[str, str]:
        return dict(self._backend_names)

    def backend_name(self) -> str:
        return format_backend(self._backend_names)

    def name(self) -> str:
        """The backend's name, as torch's ``ProcessGroup.name()``."""
        return self.backend_name()

    def backend_for(self, device_type: str) -> Any:
        """The backend serving ``device_type`` in this group, created on first use."""
        # Hot path, no lock: _shutdown marks the group destroyed *before* it empties
        # _backends, so a backend found here belongs to a live group.
        backend = self._backends.get(device_type)
        if backend is not None and not self._destroyed and not self._revoked:
            return backend
        self.require_member("a collective on it")
        if self._revoked:
            raise self.failure()
        dev = getattr(device_type, "type", device_type)
        if dev not in self._backend_names:
            raise ValueError(
                f"device: group {self.group_name!r} has no backend for {dev!r} tensors "
                f"(backend {self.backend_name()!r} serves {sorted(self._backend_names)})"
            )
        with self._lock:
            self.require_alive()
            backend = self._backends.get(dev)
            if backend is None:
                backend = self._backends[dev] = self._create(dev)
                departed = list(self._failed.items())
            else:
                departed = []
        for grank, (host, cause, detail) in departed:  # members that left before it existed
            hook = getattr(backend, "member_departed", None)
            if hook is not None:
                hook(grank, host, f"rank {grank} ({host}) {cause}" + (f": {detail}" if detail else ""))
        if self._revoked:  # revoked while it was being created (it was not told): nothing runs on it
            raise self.failure()
        return backend

    def _claim(self) -> None:
        """Detect ``new_group`` called in different orders on different ranks.

        Group names are counters, so two different groups can get one name (and
        one store namespace); their members would then talk to the wrong peers.
        Each member claims its group rank once; a second claimant is named.
        """
        if self._claimed:
            return
        me = str(self._global_rank).encode()
        holder = self._store.compare_set(f"member/{self._rank}", "", me)
        if holder != me:
            raise DistMismatchError(
                f"group {self.group_name!r}: group rank {self._rank} is claimed by global ranks "
                f"{holder.decode(errors='replace')} and {self._global_rank}; new_group must be called by every "
                f"rank, in the same order (this rank's group has ranks {list(self.ranks)})"
            )
        self._claimed = True

    def _create(self, dev: str) -> Any:
        self._claim()
        name = self._backend_names[dev]
        spec = get_backend_spec(name)
        if not spec.available():
            raise DistBackendError(unavailable_message(name, f"group {self.group_name!r} ({dev} tensors)"))
        ctx = BackendContext(
            store=PrefixStore(f"{name}/{dev}", self._store),
            rank=self._rank,
            size=len(self.ranks),
            timeout=self.timeout,
            group_name=self.group_name,
            global_ranks=self.ranks,
            device=dev,
            options=self.options,
            device_index=backend_device_index(self.device_id) if dev == "cuda" else None,
            report_loss=self._backend_lost,
            numbering=self.numbering,
        )
        log.info("creating %s backend for %s in group %r (rank %d of %d)", name, dev, self.group_name, self._rank, len(self.ranks))
        return spec.create(ctx)

    def _shutdown(self, abort: bool = False) -> None:
        """Close every backend (never raises, never waits on peers)."""
        with self._lock:
            self._destroyed = True
            backends, self._backends = list(self._backends.items()), {}
            self.lanes = {}
            self.fast = None
        for dev, backend in backends:
            try:
                backend.abort() if abort else backend.close()
            except Exception:  # noqa: BLE001 - destroy must finish even if a backend is broken
                log.warning("closing the %s backend of group %r failed", dev, self.group_name, exc_info=True)

    def __repr__(self) -> str:
        return (
            f"<ProcessGroup {self.group_name!r} ranks={list(self.ranks)} rank={self._rank} "
            f"backend={self.backend_name()!r}{' destroyed' if self._destroyed else ''}>"
        )
