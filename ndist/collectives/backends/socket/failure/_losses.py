"""What this process knows of its job's dead processes, across its groups.

A socket backend that records the loss of a peer (``GroupFailure.record``, ``_group``)
also notes it here, by the peer's process identity (host id, pid namespace, pid,
from the address it published), and every backend notes the identity of the
peers it connected to, by the job and global rank. A group built later (a
subgroup's first collective or first send) then fails at once, naming the rank,
instead of waiting the group timeout for a member that is already dead:

* its loss was recorded here (the world group, or another group, lost it), or
* it runs on this host, in this pid namespace, and its pid is gone.

The groups of this process that have the lost process as a member are told too
(``tell_groups``): a survivor that learned of the loss in one group (and stopped
calling) may be awaited by another survivor in another group.

A refused connection alone proves nothing (a peer still starting refuses too).
Process identities, not global ranks, are what is recorded as lost: after a new
``init_process_group`` round the same global rank is another process.
"""

from __future__ import annotations

import os
import threading
import weakref

from .....runtime._net import host_identity, pid_namespace

__all__ = ["JobRecord", "remember", "host_of", "record_lost", "forget", "dead_reason", "pid_gone", "watch", "tell_groups", "groups_of"]

_lock = threading.Lock()
#: (job, global rank) -> (hostid, pid namespace, pid): the latest process seen in that place
_ident: dict[tuple[str, int], tuple[str, str, int]] = {}
#: (job, global rank) -> its host name (for messages)
_hostname: dict[tuple[str, int], str] = {}
#: the socket backends of this process (each has ``job``, ``gindex``, ``failure``)
_groups: "weakref.WeakSet" = weakref.WeakSet()
#: process identity -> what recorded its loss
_lost: dict[tuple[str, str, int], str] = {}


def _identity(info: dict | None):
    if not info or "pid" not in info:
        return None
    try:
        return str(info.get("hostid", "")), str(info.get("pidns", "")), int(info["pid"])
    except (TypeError, ValueError):
        return None


def remember(job: str, grank: int, info: dict | None) -> None:
    """Global rank ``grank`` of ``job`` is the process that published ``info``."""
    ident = _identity(info)
    if ident is not None:
        with _lock:
            _ident[(job, grank)] = ident
            _hostname[(job, grank)] = str(info.get("hostname") or info.get("host") or "?")


def host_of(job: str, grank: int) -> str:
    """The host name another group saw global rank ``grank`` on ("?": none did)."""
    with _lock:
        return _hostname.get((job, grank), "?")


class JobRecord:
    """This module's record as one job's connections see it (``wire/_tcp.Mesh``): what the
    wire needs of it, handed down to the wire so that the wire imports nothing of
    ``failure``. ``job`` is the key: a group's job prefix and numbering."""

    __slots__ = ("job",)

    def __init__(self, job: str) -> None:
        self.job = job

    def remember(self, grank: int, info: dict | None) -> None:
        remember(self.job, grank, info)

    def host_of(self, grank: int) -> str:
        return host_of(self.job, grank)

    def dead_reason(self, grank: int, info: dict | None, hostid: str, pidns: str) -> str | None:
        return dead_reason(self.job, grank, info, hostid, pidns)


def _is_self(ident) -> bool:
    # (ranks run as threads of one process in some tests: a process is never its own lost peer)
    return ident[2] == os.getpid() and ident[1] == _own()[1] and ident[0] == _own()[0]


def _own() -> tuple:
    if not _self:
        _self.extend((host_identity(), pid_namespace()))
    return tuple(_self)


_self: list = []


def record_lost(job: str, grank: int, info: dict | None, message: str) -> None:
    """The process at global rank ``grank`` (published ``info``, when known) is lost."""
    ident = _identity(info)
    with _lock:
        if ident is None:
            ident = _ident.get((job, grank))
    if ident is not None and not _is_self(ident):
        with _lock:
            _lost.setdefault(ident, message)


def forget(job: str, grank: int, info: dict | None) -> None:
    """The process at global rank ``grank`` is alive after all: a group's survivors kept it
    (``shrink_group``: its member watch never saw it go; a connection to it failed by
    itself), so a group built later connects to it again."""
    ident = _identity(info)
    with _lock:
        if ident is None:
            ident = _ident.get((job, grank))
        if ident is not None:
            _lost.pop(ident, None)


def pid_gone(pid: int) -> bool:
    """No process ``pid`` exists in this pid namespace."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # EPERM: it exists, owned by someone else
        return False
    try:  # a zombie (killed, not yet reaped by its parent) is gone too
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def dead_reason(job: str, grank: int, info: dict | None, hostid: str, pidns: str) -> str | None:
    """Why global rank ``grank`` of ``job`` is known dead, or None. ``info`` is what it
    published in the group being built (None: not published yet; then the identity
    another group saw is used); ``hostid`` / ``pidns`` are this process's."""
    ident = _identity(info)
    with _lock:
        if ident is None:
            ident = _ident.get((job, grank))
        if ident is None:
            return None
        told = _lost.get(ident)
    if _is_self(ident):
        return None
    if told is not None:
        return f"this process already recorded its loss ({told})"
    if ident[0] == hostid and ident[1] == pidns and pidns and pid_gone(ident[2]):
        return f"its process (pid {ident[2]} on this host) has exited"
    return None


def watch(backend) -> None:
    """``backend`` (a SocketBackend) is told of losses other groups of this process record."""
    with _lock:
        _groups.add(backend)


def tell_groups(job: str, grank: int, host, message: str, source) -> None:
    """Every other group of ``job`` in this process with global rank ``grank`` as a
    member records its loss (each once; they tell their own peers)."""
    me = source.granks[source.rank]  # (tests run ranks as threads of one process: only this rank's groups)
    with _lock:
        groups = [b for b in _groups if b is not source and b.job == job and grank in b.gindex
                  and b.granks[b.rank] == me]
    for b in groups:
        b.failure.record(grank, host, message)


def groups_of(source) -> list:
    """The open groups of ``source``'s job in this process in which it is the same
    global rank (``source`` included)."""
    me = source.granks[source.rank]
    with _lock:
        return [b for b in _groups if b.job == source.job and b.granks[b.rank] == me and not b.closed]
