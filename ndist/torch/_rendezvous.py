"""``init_method="ndist://"``: torch's rendezvous through ndist's, for launchers torch's
``env://`` does not know.

torch's ``env://`` needs ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and a free
``MASTER_PORT`` for its own TCPStore. Under ``ndistrun`` (whose store speaks ndist's
protocol), ``mpiexec`` and ``srun`` they are not all there; ndist's ``env://``
rendezvous finds the rank and the store in each case (``docs/runtime.md``). The
handler registered here runs it and hands torch the store it found, seen as a
``torch.distributed.Store`` (``StoreForTorch``), in a namespace private to this
``init_process_group`` call (and to the ``ndistrun`` restart).

Its first join of an ``ndistrun`` attempt reads the launcher's marks of ranks that ended
before they joined (``runtime/_ended.py``), as ndist's own first ``init_process_group`` does:
a rank that exited, was killed or never started is named at once in a
``DistRankFailureError``, not waited for.

**A heal** (``ndistrun --on-failure replace``; ``_grow``): the first ``ndist://`` rendezvous
of the attempt keeps the job's store (``heal_state``). In a process started in a lost rank's
place (``NDIST_REPLACES``) it does not join the job's first group: it queues itself in the
heal's keys of the store (``runtime/_heal.py``, in ``ndist.torch/<restart>/heal``), waits until
the survivors' ``ndist.torch.grow_group`` admits it, and hands torch the grown group's store
namespace (``ndist.torch/<restart>/grow<g>``), its rank (after the survivors') and size: its
``init_process_group`` returns once it is admitted, in the grown default group.
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
from ..runtime._ended import marks_store
from ..runtime._heal import await_admission
from ..runtime._heal import register as queue_newcomer
from ..runtime._rendezvous import Rendezvous, join, rendezvous
from ..runtime.store import PrefixStore, Store
from . import _secret

__all__ = ["StoreForTorch", "ndist_rendezvous_handler", "SCHEME", "HealState", "heal_state"]

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


class HealState:
    """The job's store and this process's count of grows (``_grow``): kept by the first
    ``ndist://`` rendezvous of an ``ndistrun`` attempt."""

    def __init__(self, rdzv: Rendezvous, restart: int) -> None:
        self.rdzv, self.restart = rdzv, restart
        self.heal = PrefixStore(f"ndist.torch/{restart}/heal", rdzv.store)
        self.grows = 0  # grows of the job so far (empty ones too): the next one's number
        self.admitted = 0  # newcomers of the heal's queue that a grow admitted so far
        self.joined = False  # this process joined a running job (admitted by a grow)
        #: the global ranks' numbering of torch's groups made now (``_backend.create``): the
        #: grown default group of grow ``g`` numbers the job's processes anew, so its ndist
        #: groups say so (``ProcessGroup.numbering``: a process's loss is remembered by it)
        self.numbering = ""

    def store_of(self, g: int, timeout: timedelta) -> "StoreForTorch":
        """The store torch's grown default group of grow ``g`` uses (every member alike)."""
        store = StoreForTorch(PrefixStore(f"ndist.torch/{self.restart}/grow{g}", self.rdzv.store), keep=self.rdzv)
        store.set_timeout(timeout)
        with _lock:
            _handed.append(store)
        return store


_heal: list = []  # [HealState] once the attempt's first ndist:// rendezvous kept it


def numbering() -> str:
    """The numbering of the torch groups this process makes now (``HealState.numbering``)."""
    return _heal[0].numbering if _heal else ""


def heal_state() -> "HealState | None":
    """This process's ``HealState``; None when its first ``ndist://`` rendezvous was not under
    ``ndistrun`` (or there was none)."""
    return _heal[0] if _heal else None


def _join_running_job(rdzv: Rendezvous, env: Any, timeout: timedelta) -> Iterator:
    """A process started in a lost rank's place: queue, wait for a grow to admit it, then
    hand torch the grown group (see the module doc)."""
    state = HealState(rdzv, env.restart_count)
    try:
        token = queue_newcomer(state.heal, env.replaces, env.replacement, {})
        g, decision = await_admission(state.heal, token, timeout)
    except BaseException:
        rdzv.close()
        raise
    secret = _net.job_secret()
    if secret:
        _secret.use(secret.decode())
    joiners = list(decision["joiners"])
    survivors = int(decision["survivors"])
    state.grows, state.admitted, state.joined = g + 1, int(decision["queue_from"]) + len(joiners), True
    state.numbering = f"torch-grow{g}"
    with _lock:
        _heal[:] = [state]
    atexit.register(rdzv.close, grace=min(30.0, timeout.total_seconds()))
    yield state.store_of(g, timeout), survivors + joiners.index(token), survivors + len(joiners)


def _query_int(url: str, name: str) -> int:
    values = parse_qs(urlparse(url).query).get(name)
    return int(values[-1]) if values else -1


def ndist_rendezvous_handler(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs) -> Iterator:
    """torch's handler for ``ndist://``: yields ``(store, rank, world_size)`` once."""
    env = _env.detect()
    rank, size = _query_int(url, "rank"), _query_int(url, "world_size")
    rdzv = rendezvous("env://", rank, size, timeout, env)
    with _lock:
        n = next(_count)
    if (n == 0 and env.replaces is not None and env.agent_store is not None and rank in (-1, env.rank)
            and size in (-1, env.world_size)):
        yield from _join_running_job(rdzv, env, timeout)
        return
    try:
        ns = PrefixStore(f"ndist.torch/{env.restart_count}/{n}", rdzv.store)
        # the first of the attempt: a rank that ended before it came is named from the launcher's
        # mark (``runtime/_ended.py``), as in ndist's own first init_process_group
        marks = marks_store(rdzv.store, env.restart_count) if n == 0 and env.agent_store is not None else None
        join(PrefixStore("init", ns), rdzv.rank, rdzv.world_size, timeout, marks=marks)
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
        if n == 0 and env.agent_store is not None:
            _heal[:] = [HealState(rdzv, env.restart_count)]
    yield store, rdzv.rank, rdzv.world_size


def register() -> None:
    try:
        tdist.register_rendezvous_handler(SCHEME, ndist_rendezvous_handler)
    except RuntimeError:  # already registered (a reload)
        pass
