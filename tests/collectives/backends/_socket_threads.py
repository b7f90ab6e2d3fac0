"""Run N socket backends as threads of this process (real sockets, real shm)."""

from __future__ import annotations

import itertools
import threading
import time
import traceback
from datetime import timedelta
from types import SimpleNamespace

import numpy as np

from ndist.collectives.backends.socket import SocketBackend

from tests.backend_driver import Driver
from ndist.runtime import BackendContext, DistNetworkError, HashStore

_ids = itertools.count()


def make_backends(n, transport="auto", timeout=30.0, store=None, name=None, engine=None):
    """Construct ``n`` backends of one group concurrently; returns them by rank. ``engine``:
    ``"python"`` / ``"native"`` pins the socket backend's engine (default: ``NDIST_ENGINE``)."""
    store = store or HashStore()
    name = name or f"tg{next(_ids)}"
    out = [None] * n
    for r in range(n):
        ctx = BackendContext(store=store, rank=r, size=n, timeout=timedelta(seconds=timeout), group_name=name,
                             global_ranks=tuple(range(n)), device="cpu",
                             options=SimpleNamespace(transport=transport, socket_engine=engine))
        out[r] = Driver(SocketBackend(ctx))
    return out


def run_threads(backends, fn, timeout=60.0):
    """``fn(backend)`` on one thread per backend; re-raise the first failure with its rank."""
    n = len(backends)
    results, errors = [None] * n, [None] * n

    def target(r):
        try:
            results[r] = fn(backends[r])
        except BaseException as err:  # noqa: BLE001
            errors[r] = (err, traceback.format_exc())

    threads = [threading.Thread(target=target, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"threads still running after {timeout} s (hang)")
    for r, e in enumerate(errors):
        if e is not None:
            raise AssertionError(f"rank {r} failed:\n{e[1]}") from e[0]
    return results


def run_group(n, fn, transport="auto", timeout=30.0, engine=None):
    backends = make_backends(n, transport, timeout, engine=engine)
    try:
        return run_threads(backends, fn, timeout=timeout * 2)
    finally:
        for b in backends:
            b.close()


def wait_in_all_reduce(backends, ranks, timeout=90.0):
    """Start ``ranks`` (of ``backends``) in an all_reduce of 8 ones, one thread each, for a
    test that fails one of their peers while they wait. Returns ``(got, threads)``: once a
    rank's thread has ended, ``got[rank]`` is ``("ok", None, None, seconds)``, or for a
    ``DistNetworkError`` ``(its type's name, its rank, its message, seconds)``."""
    got = {}

    def wait(r):
        t0 = time.monotonic()
        try:
            backends[r].all_reduce(np.ones(8), blocking=True).wait(timeout=timeout)
            got[r] = ("ok", None, None, time.monotonic() - t0)
        except DistNetworkError as err:
            got[r] = (type(err).__name__, err.rank, str(err), time.monotonic() - t0)

    threads = [threading.Thread(target=wait, args=(r,), daemon=True) for r in ranks]
    for t in threads:
        t.start()
    return got, threads


def check_a_loss_told_to_one_rank_wakes_every_waiter(backends) -> None:
    """4 ranks of one group (up): ranks 0, 1 and 2 wait in an all_reduce for rank 3, which
    never calls it. Rank 2's backend learns from elsewhere (``GroupFailure.record``, as from
    its point-to-point side) that rank 3 is lost: rank 2, and the ranks waiting on rank 3
    rather than on rank 2, raise naming rank 3 at once (not at the group's timeout), and
    rank 2's next collective raises the same error."""
    import pytest

    got, threads = wait_in_all_reduce(backends, (0, 1, 2))
    time.sleep(0.5)  # all three waiting in C
    backends[2].failure.record(3, "h3", "lost point-to-point connection to rank 3 (h3): reset")
    for t in threads:
        t.join(60)
    for r in (0, 1, 2):
        kind, rank, msg, waited = got[r]
        assert kind in ("DistRankFailureError", "DistNetworkError") and rank == 3, got[r]
        assert "rank 3" in msg and "all_reduce" in msg, msg
        assert waited < 0.5 + 5, got[r]  # ~20 ms after the notice on a quiet machine
    with pytest.raises(DistNetworkError, match="rank 3") as ei:
        backends[2].barrier(blocking=True).wait(timeout=30)
    assert ei.value.rank == 3
