"""Ranks as threads of this process, each building its own backend of one group (a real
backend: real sockets, shared memory, NCCL) and running a function on it."""

from __future__ import annotations

import contextlib
import itertools
import threading
import traceback
from datetime import timedelta

from ndist.runtime import BackendContext, HashStore

_ids = itertools.count()


def run_backends(n, make, fn, *, device="cpu", options=None, on_rank=None, timeout=60.0, join=2, name=None):
    """``fn(backend)`` on ``n`` threads; rank r's backend is ``make(ctx)`` for a
    ``BackendContext`` of one group on ``device`` (a fresh ``HashStore``; ``options``: the
    context's options, or a function of the rank giving them), built in the rank's thread, as
    the ranks rendezvous. ``on_rank(r)``: a context manager the rank's work and its backend's
    close run in (its CUDA device). Every thread gets ``timeout * join`` seconds; returns the
    results by rank, fails naming the rank that raised (with its traceback) or "a rank hung",
    and closes every backend."""
    store = HashStore()
    name = name or f"threads{next(_ids)}"
    on_rank = on_rank or (lambda r: contextlib.nullcontext())
    backends: list = [None] * n
    results: list = [None] * n
    errors: list = [None] * n

    def target(r):
        try:
            with on_rank(r):
                ctx = BackendContext(store=store, rank=r, size=n, timeout=timedelta(seconds=timeout),
                                     group_name=name, global_ranks=tuple(range(n)), device=device,
                                     **({} if options is None else
                                        {"options": options(r) if callable(options) else options}))
                backends[r] = make(ctx)
                results[r] = fn(backends[r])
        except BaseException:  # noqa: BLE001 - reported below with the rank
            errors[r] = traceback.format_exc()

    threads = [threading.Thread(target=target, args=(r,), daemon=True) for r in range(n)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout * join)
        assert not any(t.is_alive() for t in threads), "a rank hung"
        for r, err in enumerate(errors):
            assert err is None, f"rank {r} failed:\n{err}"
        return results
    finally:
        for r, b in enumerate(backends):
            if b is not None:
                with on_rank(r):
                    b.close()
