"""A heal's keys in the job's store: newcomers wait, the survivors' grow admits them.

A process started in a lost rank's place (``ndistrun --on-failure replace``: ``NDIST_REPLACES``)
joins a running job; the survivors admit it with ``grow_group`` (``_grow``) at a step
boundary. They meet in the store, under ``heal/`` in the namespace of the job's first
``init_process_group`` of the launcher's attempt (``ndist/<restart>/0``):

* ``joiner/<token>``: a newcomer's facts (the rank it replaces, its host and pid, its member
  watch's address), set *before* it appends ``<token>,`` to
* ``queue``: the newcomers in the order they came (``Store.append``: one atomic step, so a
  survivor that reads the queue finds every listed newcomer's facts);
* ``grow/<g>/decision``: the ``g``-th grow of the job (counted job-wide, empty ones too; every
  member knows ``g``: the survivors count their calls, a newcomer is told): the first survivor
  to arrive proposes it with one ``compare_set`` (the newcomers queued at that moment, beyond
  those an earlier grow admitted) and every survivor adopts the same one;
* ``admitted/<token>``: ``g``, set by every survivor that adopted a decision admitting the
  newcomer (one is enough: a survivor may die right after deciding);
* ``grow/<g>/ready/<rank>``: a member of the grown group (new numbering) is ready: its member
  watch covers the newcomers. The grow returns once every member is ready, and fails, naming
  the ranks, as soon as one is known lost instead.

A newcomer's job rank (the member watch's name for it, ``_World.job_ranks``) is the job's
original world size plus its place in the queue: above every rank the job ever had.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from datetime import timedelta
from typing import Callable

from ._errors import DistNetworkError, DistRankFailureError, DistTimeoutError
from .store import PrefixStore, Store

__all__ = ["HEAL_NAMESPACE", "heal_store", "register", "await_admission", "read_queue", "propose", "admit",
           "ready", "await_ready", "newcomer_rank", "listeners_alive"]

HEAL_NAMESPACE = "heal"
_POLL_S = 0.05


def heal_store(first_job_store: Store) -> Store:
    """The heal's namespace inside the job namespace of the attempt's first init."""
    return PrefixStore(HEAL_NAMESPACE, first_job_store)


def newcomer_rank(world_size: int, place: int) -> int:
    """The job rank of the newcomer at ``place`` (0-based) in the queue of a job that
    started with ``world_size`` ranks."""
    return world_size + place


# ----------------------------------------------------------------- the newcomer's side
def register(store: Store, replaces: int, replacement: int, watch_info: dict) -> str:
    """Queue this process as a newcomer; returns its token."""
    token = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
    info = {"replaces": replaces, "replacement": replacement, "host": socket.gethostname(), "pid": os.getpid(),
            "watch": watch_info}
    store.set(f"joiner/{token}", json.dumps(info))
    store.append("queue", f"{token},")
    return token


def await_admission(store: Store, token: str, timeout: timedelta,
                    anyone_left: Callable[[], bool] | None = None) -> tuple[int, dict]:
    """Wait until a grow admits the newcomer ``token``: ``(g, decision)``. ``DistTimeoutError``
    when no grow admits it within ``timeout`` (the survivors never called ``grow_group``);
    ``DistNetworkError`` once ``anyone_left()`` (asked every second) says no member of the job
    is alive any more: nobody is left to admit it."""
    key = f"admitted/{token}"
    seconds = timeout.total_seconds()
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        try:
            store.wait([key], timedelta(seconds=max(0.001, min(left, 1.0))))
            break
        except DistTimeoutError:
            if anyone_left is not None and not anyone_left() and not store.check([key]):
                raise DistNetworkError(
                    "init_process_group (joining a running job): every process of the job has ended, and none "
                    "admitted this one; the survivors admit newcomers with dist.grow_group() at a step boundary "
                    "(ndistrun --on-failure replace)") from None
            if left <= 1.0:
                raise DistTimeoutError(
                    f"init_process_group (joining a running job): no grow_group of the survivors admitted this "
                    f"process within {seconds:g} s; the survivors admit newcomers with dist.grow_group() at a step "
                    "boundary") from None
    g = int(store.get(key))
    return g, json.loads(store.get(f"grow/{g}/decision"))


def listeners_alive(watch_store: Store, world_size: int, heal: Store) -> bool:
    """Whether any process of the job may still admit a newcomer: a member watch listener of
    the job's (its first ranks', or an admitted newcomer's: ``addr/<rank>`` in the watch's
    namespace) accepts a connection. A dead process's listener refuses at once; a port some
    other listener took since only makes this say alive (the admission's timeout still holds)."""
    ranks = range(world_size + len(read_queue(heal)))
    keys = [f"addr/{r}" for r in ranks]
    published = [k for k in keys if watch_store.check([k])]
    for raw in (watch_store.multi_get(published) if published else []):
        info = json.loads(raw)
        try:
            socket.create_connection((info["host"], info["port"]), timeout=0.5).close()
            return True
        except (socket.timeout, TimeoutError):
            return True  # (a busy listener: alive)
        except OSError:
            continue
    return False


# ----------------------------------------------------------------- the survivors' side
def read_queue(store: Store) -> list[str]:
    """Every newcomer's token, in the order they came."""
    if not store.check(["queue"]):
        return []
    return [t for t in store.get("queue").decode().split(",") if t]


def propose(store: Store, g: int, proposal: dict) -> dict:
    """Propose grow ``g``'s decision; the one that won (the first proposal)."""
    return json.loads(store.compare_set(f"grow/{g}/decision", "", json.dumps(proposal)))


def joiner_info(store: Store, token: str) -> dict:
    return json.loads(store.get(f"joiner/{token}"))


def admit(store: Store, g: int, tokens: list[str]) -> None:
    """Tell each newcomer of ``tokens`` that grow ``g`` admitted it."""
    if tokens:
        store.multi_set([f"admitted/{t}" for t in tokens], [str(g)] * len(tokens))


# ----------------------------------------------------------------- every member
def ready(store: Store, g: int, rank: int) -> None:
    store.set(f"grow/{g}/ready/{rank}", "1")


def await_ready(store: Store, g: int, size: int, lost: Callable[[], dict[int, tuple[str, str, str]]],
                timeout: float, what: str) -> dict[int, tuple[str, str, str]]:
    """Wait until every member (``size``, new numbering) of grow ``g`` is ready; returns at
    once with the members known lost (``lost()``: group rank -> (host, cause, detail)) when
    any is, ``{}`` when all are ready. ``DistTimeoutError`` naming the others after ``timeout``."""
    keys = [f"grow/{g}/ready/{r}" for r in range(size)]
    deadline = time.monotonic() + timeout
    while True:
        gone = lost()
        if gone:
            return gone
        left = deadline - time.monotonic()
        try:
            store.wait(keys, timedelta(seconds=max(0.001, min(left, _POLL_S))))
            gone = lost()  # (a member may be ready and lost: the group is revoked all the same)
            return gone
        except DistTimeoutError:
            if left <= _POLL_S:
                missing = [r for r, k in enumerate(keys) if not store.check([k])]
                raise DistTimeoutError(f"{what}: ranks {missing} of the grown group were not ready within "
                                       f"{timeout:g} s") from None


def lost_error(what: str, group_name: str, gone: dict[int, tuple[str, str, str]]) -> DistRankFailureError:
    """The error of a grow during which members (group ranks of the grown group) were lost."""
    ranks = sorted(gone)
    said = "; ".join(f"rank {r} ({gone[r][0]}) {gone[r][1]}" + (f": {gone[r][2]}" if gone[r][2] else "")
                     for r in ranks)
    return DistRankFailureError(
        f"{what}: the grown group {group_name!r} lost {'members' if len(ranks) > 1 else 'a member'} during the "
        f"grow: {said}. It is the default group now, revoked: call shrink_group() (every member), then "
        "grow_group() again", failed_ranks=ranks, hosts=[gone[r][0] for r in ranks],
        causes=[gone[r][1] for r in ranks], rank=ranks[0], host=gone[ranks[0]][0])
