"""``init_method="ndist://"``: torch's rendezvous through ndist's, for launchers torch's
``env://`` does not know.

torch's ``env://`` needs ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and a free
``MASTER_PORT`` for its own TCPStore. Under ``ndistrun`` (whose store speaks ndist's
protocol), ``mpiexec`` and ``srun`` they are not all there; ndist's ``env://``
rendezvous finds the rank and the store in each case (``docs/runtime.md``). The
handler registered here runs it and hands torch the store it found, seen as a
``torch.distributed.Store`` (``StoreForTorch``), in a namespace private to this
``init_process_group`` call (and to the ``ndistrun`` restart).
"""

from __future__ import annotations

import atexit
import itertools
import threading
from datetime import timedelta
from typing import Any, Iterator, Sequence
from urllib.parse import parse_qs, urlparse

import torch.distributed as tdist

from ..runtime import DistError, _env
from ..runtime import _net
from ..runtime._rendezvous import join, rendezvous
from ..runtime.store import PrefixStore, Store
from . import _secret

__all__ = ["StoreForTorch", "ndist_rendezvous_handler", "SCHEME"]

SCHEME = "ndist"
_count = itertools.count()
_lock = threading.Lock()
# torch reaches a Python store's methods only while its Python object lives, and torch
# keeps only the C++ half: every store handed to torch is held here, for the process.
_handed: list = []


def _store_error(err: DistError) -> BaseException:
    out = tdist.DistStoreError(f"{type(err).__name__}: {err}")
    out.__cause__ = err
    return out


class StoreForTorch(tdist.Store):
    """An ndist ``Store`` as a ``torch.distributed.Store`` (torch's Python store hooks)."""

    def __init__(self, store: Store, keep: Any = None) -> None:
        super().__init__()
        self._nd_store = store
        self._nd_keep = keep  # the rendezvous (its store server lives as long as this store)

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except DistError as err:
            raise _store_error(err) from err

    def set(self, key: str, value) -> None:
        self._call(self._nd_store.set, key, value)

    def get(self, key: str) -> bytes:
        return self._call(self._get, key)

    def _get(self, key: str) -> bytes:
        self._nd_store.wait([key], self.timeout)
        return self._nd_store.get(key)

    def add(self, key: str, value: int) -> int:
        return self._call(self._nd_store.add, key, int(value))

    def compare_set(self, key: str, expected, desired) -> bytes:
        return self._call(self._nd_store.compare_set, key, expected, desired)

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        self._call(self._nd_store.wait, list(keys), timeout if timeout is not None else self.timeout)

    def check(self, keys: Sequence[str]) -> bool:
        return self._call(self._nd_store.check, list(keys))

    def delete_key(self, key: str) -> bool:
        return self._call(self._nd_store.delete_key, key)

    def num_keys(self) -> int:
        return self._call(self._nd_store.num_keys)

    def append(self, key: str, value) -> None:
        self._call(self._nd_store.append, key, value)

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        self.wait(keys)
        return self._call(self._nd_store.multi_get, list(keys))

    def multi_set(self, keys: Sequence[str], values) -> None:
        self._call(self._nd_store.multi_set, list(keys), list(values))

    def clone(self) -> "StoreForTorch":
        """Another ``StoreForTorch`` over the same ndist store (torch's ``Store.clone``: its
        ``shrink_group`` clones the old group's store for the new group). ndist's store
        clients are safe to share between threads; the clone keeps the same timeout, and is
        held for the process as every store handed to torch is (``_handed``)."""
        twin = StoreForTorch(self._nd_store, keep=self._nd_keep)
        twin.set_timeout(self.timeout)
        with _lock:
            _handed.append(twin)
        return twin


def _query_int(url: str, name: str) -> int:
    values = parse_qs(urlparse(url).query).get(name)
    return int(values[-1]) if values else -1


def ndist_rendezvous_handler(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs) -> Iterator:
    """torch's handler for ``ndist://``: yields ``(store, rank, world_size)`` once."""
    env = _env.detect()
    rdzv = rendezvous("env://", _query_int(url, "rank"), _query_int(url, "world_size"), timeout, env)
    try:
        with _lock:
            n = next(_count)
        ns = PrefixStore(f"ndist.torch/{env.restart_count}/{n}", rdzv.store)
        join(PrefixStore("init", ns), rdzv.rank, rdzv.world_size, timeout)
    except BaseException:
        rdzv.close()
        raise
    secret = _net.job_secret()  # the launcher's, or the one the MPI rendezvous agreed on
    if secret:
        _secret.use(secret.decode())
    # rank 0 may host the store: keep it up until the peers are done with it (bounded)
    atexit.register(rdzv.close, grace=min(30.0, timeout.total_seconds()))
    store = StoreForTorch(ns, keep=rdzv)
    store.set_timeout(timeout)
    with _lock:
        _handed.append(store)
    yield store, rdzv.rank, rdzv.world_size


def register() -> None:
    try:
        tdist.register_rendezvous_handler(SCHEME, ndist_rendezvous_handler)
    except RuntimeError:  # already registered (a reload)
        pass
