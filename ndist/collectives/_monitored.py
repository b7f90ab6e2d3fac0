"""``monitored_barrier``: a barrier that names the ranks that did not arrive.

It runs through the group's store, not the backend, so every wait has a
deadline whatever the backend (socket, mpi, nccl) and whatever state a peer is
in. Call ``n`` of a group (each member counts its own calls) uses the keys
``monitored_barrier/<n>/arrive/<group rank>`` and ``.../release``:

* every rank but group rank 0 sets its ``arrive`` key, then waits for
  ``release``;
* group rank 0 waits for the ``arrive`` keys in rank order until ``timeout``
  after it entered. The first missing rank (every missing rank with
  ``wait_all_ranks=True``) is named in a ``DistTimeoutError``, which rank 0
  raises and also writes to ``release``, so the ranks that did arrive raise
  the same report at once instead of waiting out their own deadline;
* a rank that is never released (rank 0 absent, or it arrived after rank 0 gave
  up) raises after ``2 x timeout``.
"""

from __future__ import annotations

import time
from datetime import timedelta

from ..runtime import DistTimeoutError, resolve_group
from ..runtime._timeout import check_timeout
from . import _check

__all__ = ["monitored_barrier"]

_OK = b"ok"
_FAILED = b"failed:"


_SLICE_S = 0.1  # between two looks at whether the group lost a member


def _arrived(store, key: str, deadline: float, pg) -> bool:
    """Wait for ``key`` until ``deadline``, in slices: a member lost meanwhile fails the
    wait at once with the group's ``DistRankFailureError`` (it would never arrive)."""
    while True:
        pg.require_healthy()
        left = deadline - time.monotonic()
        if left <= 0:
            return store.check([key])
        try:
            store.wait([key], timedelta(seconds=min(left, _SLICE_S)))
            return True
        except DistTimeoutError:
            if store.check([key]):  # it may have arrived as the wait gave up
                return True


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """Block until every rank of ``group`` entered; on group rank 0, raise
    ``DistTimeoutError`` naming the first rank (all ranks, with ``wait_all_ranks``)
    that did not arrive within ``timeout`` (default: the group's timeout)."""
    pg = resolve_group(group)
    if not pg.is_member:  # whatever the other collectives do for a non-member group
        from ._common import member_group

        member_group(group)
        return None
    seconds = check_timeout(timeout, pg.timeout).total_seconds()
    _check.check_bool("wait_all_ranks", wait_all_ranks)
    me, size = pg.rank(), pg.size()
    if size == 1:
        return None
    pg.require_healthy()  # a revoked group: the same error as every other op
    n = getattr(pg, "_monitored_barriers", 0) + 1
    pg._monitored_barriers = n
    store = pg.store
    prefix = f"monitored_barrier/{n}"
    deadline = time.monotonic() + seconds
    if me != 0:
        store.set(f"{prefix}/arrive/{me}", _OK)
        if not _arrived(store, f"{prefix}/release", time.monotonic() + 2 * seconds, pg):
            raise DistTimeoutError(
                f"monitored_barrier: rank {pg.ranks[me]} was not released by rank {pg.ranks[0]} within "
                f"{2 * seconds:g} s (twice the timeout; rank {pg.ranks[0]} names the ranks that did not arrive; "
                f"group {pg.group_name!r})"
            ) from None
        verdict = store.get(f"{prefix}/release")
        if verdict.startswith(_FAILED):
            raise DistTimeoutError(f"monitored_barrier: rank {pg.ranks[0]} reports: "
                                   f"{verdict[len(_FAILED):].decode(errors='replace')}")
        return None
    missing = []
    for r in range(1, size):
        if not _arrived(store, f"{prefix}/arrive/{r}", deadline, pg):
            missing.append(pg.ranks[r])
            if not wait_all_ranks:
                break
    if missing:
        which = "Ranks" if len(missing) > 1 else "Rank"
        message = (f"{which} {', '.join(map(str, missing))} failed to pass monitoredBarrier in {seconds:g} s "
                   f"(group {pg.group_name!r})")
        store.set(f"{prefix}/release", _FAILED + message.encode())
        raise DistTimeoutError(f"monitored_barrier: {message}")
    store.set(f"{prefix}/release", _OK)
    for r in range(1, size):
        store.delete_key(f"{prefix}/arrive/{r}")
    return None
