"""Rendezvous: from an init method (``env://``, ``tcp://``, ``file://``, MPI)
to a store every rank shares, this process's rank and the world size.

Handlers live in a registry keyed by URL scheme, as in c10d
(``register_rendezvous_handler``). After the store is reached, ``join``
makes every rank claim ``rank/<i>`` and wait for the others, so that a rank
that never comes is reported by number instead of hanging the job, and a rank
the launcher saw end before it came is named at once (``_ended``).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable
from urllib.parse import parse_qs, urlparse

from . import _net
from ._ended import ended_marks, raise_for_marks
from ._env import JobEnv
from ._errors import DistNetworkError, DistStoreError, DistTimeoutError
from .store import FileStore, Store, TCPStore, TCPStoreServer

__all__ = ["Rendezvous", "register_rendezvous_handler", "rendezvous", "join", "mpi_rendezvous"]

log = logging.getLogger("ndist.runtime.rendezvous")


@dataclass
class Rendezvous:
    """What a rendezvous handler found: the shared store, rank and world size."""

    store: Store
    rank: int
    world_size: int
    owned: list = field(default_factory=list)  # stores / servers to close on destroy
    via: str = ""

    def close(self, grace: float = 0.0) -> None:
        for obj in reversed(self.owned):
            try:
                if isinstance(obj, TCPStore):
                    obj.shutdown(grace)
                elif isinstance(obj, TCPStoreServer):
                    if grace > 0:
                        obj.wait_idle(grace, ignore=f"{socket.gethostname()}:{os.getpid()}")
                    obj.close()
                else:
                    obj.close()
            except Exception:  # noqa: BLE001 - closing must not fail destroy
                log.debug("closing %r failed", obj, exc_info=True)
        self.owned.clear()


Handler = Callable[[str, int, int, timedelta, JobEnv], Rendezvous]
_handlers: dict[str, Handler] = {}


def register_rendezvous_handler(scheme: str, handler: Handler) -> None:
    """Register ``handler(url, rank, world_size, timeout, env) -> Rendezvous`` for ``scheme://``."""
    if not isinstance(scheme, str) or not scheme:
        raise ValueError(f"scheme: expected a non-empty str, got {scheme!r}")
    if scheme in _handlers:
        raise RuntimeError(f"rendezvous handler for {scheme}:// is already registered")
    _handlers[scheme] = handler


def rendezvous(url: str, rank: int, world_size: int, timeout: timedelta, env: JobEnv) -> Rendezvous:
    if not isinstance(url, str):
        raise TypeError(f"init_method: expected a URL str, got {type(url).__name__}")
    scheme = urlparse(url).scheme
    if scheme not in _handlers:
        raise ValueError(
            f"init_method: no rendezvous handler for {scheme + '://' if scheme else repr(url)}; "
            f"registered: {sorted(s + '://' for s in _handlers)}"
        )
    return _handlers[scheme](url, rank, world_size, timeout, env)


# ----------------------------------------------------------------- helpers
def _query_int(url: str, name: str) -> int | None:
    values = parse_qs(urlparse(url).query).get(name)
    if not values:
        return None
    try:
        return int(values[-1])
    except ValueError:
        raise ValueError(f"init_method: {name} in {url!r} is not an integer: {values[-1]!r}") from None


def _resolve_rank_size(url: str, rank: int, world_size: int, env: JobEnv, how: str) -> tuple[int, int]:
    if rank < 0:
        rank = _query_int(url, "rank") if _query_int(url, "rank") is not None else (env.rank if env.rank is not None else -1)
    if world_size < 0:
        q = _query_int(url, "world_size")
        world_size = q if q is not None else (env.world_size if env.world_size is not None else -1)
    if rank < 0:
        raise ValueError(f"rank: {how} rendezvous needs a rank (argument, ?rank= or environment variable RANK), got none")
    if world_size < 1:
        raise ValueError(
            f"world_size: {how} rendezvous needs a world size (argument, ?world_size= or environment variable "
            f"WORLD_SIZE), got none"
        )
    if rank >= world_size:
        raise ValueError(f"rank: expected 0 <= rank < world_size ({world_size}), got {rank}")
    return rank, world_size


def _tcp_store(host: str, port: int, rank: int, world_size: int, timeout: timedelta, host_it: bool) -> Rendezvous:
    if host_it:
        store = TCPStore(host, port, world_size, is_master=True, timeout=timeout, wait_for_workers=False)
        return Rendezvous(store, rank, world_size, owned=[store], via="tcp")
    try:
        store = TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    except (DistTimeoutError, DistNetworkError) as err:
        raise type(err)(
            f"rank {rank}: could not reach the store at {host}:{port} (hosted by rank 0 or the launcher) "
            f"within {timeout.total_seconds():g} s: {err}"
        ) from None
    return Rendezvous(store, rank, world_size, owned=[store], via="tcp")


def _parse_hostport(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{what}: expected 'host:port', got {text!r}")
    return host.strip("[]"), int(port)


# ----------------------------------------------------------------- handlers
def _env_handler(url: str, rank: int, world_size: int, timeout: timedelta, env: JobEnv) -> Rendezvous:
    if env.under_mpi and env.master_addr is None and env.agent_store is None:
        return mpi_rendezvous(rank, world_size, timeout)
    rank, world_size = _resolve_rank_size(url, rank, world_size, env, "env://")
    if env.agent_store is not None:  # ndistrun hosts the store
        host, port = _parse_hostport(env.agent_store, "NDIST_STORE")
        return _tcp_store(host, port, rank, world_size, timeout, host_it=False)
    if env.master_addr is None:
        raise ValueError(
            "MASTER_ADDR: env:// rendezvous expects environment variable MASTER_ADDR (the host of rank 0), but it is not set"
        )
    if env.master_port is None:
        raise ValueError("MASTER_PORT: env:// rendezvous expects environment variable MASTER_PORT, but it is not set")
    return _tcp_store(env.master_addr, env.master_port, rank, world_size, timeout, host_it=rank == 0)


def _tcp_handler(url: str, rank: int, world_size: int, timeout: timedelta, env: JobEnv) -> Rendezvous:
    parsed = urlparse(url)
    if not parsed.hostname or parsed.port is None:
        raise ValueError(f"init_method: expected 'tcp://host:port', got {url!r}")
    rank, world_size = _resolve_rank_size(url, rank, world_size, env, "tcp://")
    return _tcp_store(parsed.hostname, parsed.port, rank, world_size, timeout, host_it=rank == 0)


def _file_handler(url: str, rank: int, world_size: int, timeout: timedelta, env: JobEnv) -> Rendezvous:
    parsed = urlparse(url)
    path = (parsed.netloc + parsed.path) if parsed.netloc else parsed.path
    if not path:
        raise ValueError(f"init_method: expected 'file:///path/to/file', got {url!r}")
    rank, world_size = _resolve_rank_size(url, rank, world_size, env, "file://")
    store = FileStore(path, world_size, timeout=timeout)
    return Rendezvous(store, rank, world_size, owned=[store], via="file")


def _routable_address() -> str:
    """An address of this host that other hosts can reach (best effort)."""
    name = socket.gethostname()
    try:
        addr = socket.gethostbyname(name)
        if not addr.startswith("127."):
            return addr
    except OSError:
        pass
    try:  # no packet is sent: this only asks the kernel which interface routes outward
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))
            return s.getsockname()[0]
    except OSError:
        return name


def mpi_rendezvous(rank: int, world_size: int, timeout: timedelta) -> Rendezvous:
    """Under mpiexec without MASTER_ADDR: rank 0 starts the store, MPI broadcasts
    its address and the job secret (``$NDIST_SECRET`` or a fresh one)."""
    try:
        from mpi4py import MPI  # lazy: only under an MPI launcher
    except ImportError as err:
        raise ValueError(
            "MASTER_ADDR: running under an MPI launcher without MASTER_ADDR needs mpi4py to agree on a store "
            f"address ({err}); install it (pip install 'ndist[mpi]') or set MASTER_ADDR/MASTER_PORT"
        ) from None
    comm = MPI.COMM_WORLD
    me, size = comm.Get_rank(), comm.Get_size()
    if rank >= 0 and rank != me:
        raise ValueError(f"rank: expected the MPI rank {me} under mpiexec, got {rank}")
    if world_size > 0 and world_size != size:
        raise ValueError(f"world_size: expected the MPI world size {size} under mpiexec, got {world_size}")
    hosts = comm.allgather(socket.gethostname())
    info: tuple | None = None
    server = None
    if me == 0:
        try:
            secret = os.environ.get(_net.SECRET_ENV) or secrets.token_hex(32)
            single_host = len(set(hosts)) == 1
            server = TCPStoreServer("127.0.0.1" if single_host else "0.0.0.0", 0, secret)
            addr = "127.0.0.1" if single_host else _routable_address()
            info = (addr, server.port, secret, None)
        except Exception as err:  # noqa: BLE001 - every rank must learn of it, not hang in bcast
            info = (None, None, None, f"{type(err).__name__}: {err}")
    info = comm.bcast(info, root=0)
    addr, port, secret, failure = info
    if failure:
        raise DistStoreError(f"rank 0 could not start the rendezvous store: {failure}")
    _net.set_job_secret(secret)
    try:
        store = TCPStore(addr, port, size, timeout=timeout, secret=secret)
    except BaseException:
        if server is not None:
            server.close()
        raise
    owned = [server, store] if server is not None else [store]
    return Rendezvous(store, me, size, owned=owned, via="mpi")


register_rendezvous_handler("env", _env_handler)
register_rendezvous_handler("tcp", _tcp_handler)
register_rendezvous_handler("file", _file_handler)


# ------------------------------------------------------------------- join
#: how often a join that still waits looks for the launcher's marks of ranks that ended
#: before they joined (``_ended``); a mark that completes the wait is seen at once
_ENDED_POLL_S = 0.25


def join(store: Store, rank: int, world_size: int, timeout: timedelta, marks: Store | None = None) -> None:
    """Claim ``rank/<rank>`` and wait for every other rank's claim.

    A second process claiming the same rank is an error naming it; ranks
    that do not come within ``timeout`` are listed in the ``DistTimeoutError``.
    A rank the launcher saw end before it claimed (``_ended``) is named at once
    in a ``DistRankFailureError``: its mark is read in ``marks`` (default: ``store``
    itself, the namespace of ndist's first ``init_process_group``; ``_ended.marks_store``
    for a join elsewhere, such as torch's ``ndist://`` rendezvous).
    """
    if marks is None:
        marks = store
    token = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
    held = store.compare_set(f"rank/{rank}", "", token)
    if held != token.encode():
        raise ValueError(
            f"rank: rank {rank} was already claimed in this rendezvous by {held.decode(errors='replace')}; "
            f"two processes were given RANK={rank} (or the store is left over from an earlier job, e.g. a "
            f"file:// rendezvous file that was not removed)"
        )
    keys = [f"rank/{r}" for r in range(world_size)]
    seconds = timeout.total_seconds()
    t0 = time.monotonic()
    deadline = t0 + seconds
    while True:
        left = deadline - time.monotonic()
        try:  # in slices: a rank that ended before it joined is named, not waited for
            store.wait(keys, timedelta(seconds=max(0.001, min(left, _ENDED_POLL_S))))
            done = True
        except DistTimeoutError:
            done = False
        ended = ended_marks(marks, rank, world_size)
        if ended:
            raise_for_marks(marks, rank, world_size, ended)
        if done:
            break
        if left <= _ENDED_POLL_S:
            missing = [r for r in range(world_size) if not store.check([f"rank/{r}"])]
            if not missing:  # they all arrived just now
                break
            raise DistTimeoutError(
                f"rendezvous: {world_size - len(missing)} of {world_size} ranks joined within {seconds:g} s; "
                f"missing: {missing}"
            ) from None
    log.info("rank %d: all %d ranks joined in %.3f s", rank, world_size, time.monotonic() - t0)
