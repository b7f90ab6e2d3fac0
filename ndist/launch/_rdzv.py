"""Rendezvous of the agents, through the store the launcher hosts.

Single node: the agent starts a ``TCPStoreServer`` on loopback (a free port
unless ``--master-port``), a fresh one for every attempt so a restarted
group never sees the keys of the one before; that is all.

Several nodes: the agent of node 0 hosts one ``TCPStoreServer`` on
``--master-port`` (all interfaces; every connection must prove the shared
``NDIST_SECRET``) for the whole job. For attempt ``k`` every agent claims
``ndistrun/k/node/<node_rank>`` with its host and local world size
(``compare_set``, so two agents claiming one node rank is an error), waits
for all nodes, and derives the world size and its first global rank from
the node ranks in order. A failing node publishes its root cause under
``ndistrun/k/failed`` and sets every node's ``ndistrun/k/wake/<node>`` to
``stop``; a watcher thread in each agent waits on its own wake key and wakes
the monitor loop, which stops the local ranks (an agent ending the attempt
sets its key to ``done`` to release its watcher). Node 0 keeps the store up until every node reported its end of the
attempt. Ranks use the same store under their own keys; the runtime keys
them by ``NDIST_RESTART_COUNT``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from dataclasses import dataclass

__all__ = ["LaunchError", "Round", "make_rendezvous"]

log = logging.getLogger("ndist.launch")

_PREFIX = "ndistrun"
#: how long a node other than node 0 tries to report the end of an attempt to the store
_END_TIMEOUT = 15.0


class LaunchError(Exception):
    """The job cannot start or rendezvous as configured; the CLI prints the message."""


@dataclass(frozen=True)
class Round:
    world_size: int
    rank_offset: int
    master_addr: str
    master_port: int


def make_rendezvous(config, secret: str, wake_fd: int | None = None):
    """The rendezvous for ``config``; ``wake_fd`` gets ``WAKE_STOP`` when another node fails."""
    if config.single_node:
        return _LocalRendezvous(config, secret)
    return _StoreRendezvous(config, secret, wake_fd)


class _LocalRendezvous:
    def __init__(self, config, secret: str) -> None:
        self.config = config
        self.secret = secret
        self.server = None

    def next_round(self, attempt: int) -> Round:
        from ndist.runtime.store import TCPStoreServer

        c = self.config
        if self.server is not None:
            self.server.close()
            self.server = None
        addr = c.master_addr or "127.0.0.1"
        self.server = _start_server(TCPStoreServer, addr, c.master_port or 0, self.secret)
        return Round(c.nproc_per_node, 0, addr, self.server.port)

    def report_success(self, attempt: int) -> None:
        pass

    def report_failure(self, attempt: int, failure) -> None:
        pass

    def report_stop(self, attempt: int) -> None:
        pass

    def remote_failure(self, attempt: int):
        return None

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


def _start_server(cls, host: str, port: int, secret: str):
    from ndist.runtime import DistNetworkError

    try:
        return cls(host, port, secret)
    except DistNetworkError as err:
        raise LaunchError(f"cannot host the job's store on {host}:{port}: {err}") from None


class _StoreRendezvous:
    def __init__(self, config, secret: str, wake_fd: int | None) -> None:
        from ndist.runtime.store import TCPStore, TCPStoreServer

        self.wake_fd = wake_fd
        c = self.config = config
        self.secret = secret
        self.addr = c.master_addr or "127.0.0.1"
        from ._config import DEFAULT_MULTINODE_PORT

        self.port = c.master_port or DEFAULT_MULTINODE_PORT
        self.server = None
        if c.node_rank == 0:
            self.server = _start_server(TCPStoreServer, "", self.port, secret)
        connect_to = "127.0.0.1" if self.server is not None else self.addr
        self._store_args = (connect_to, self.port)
        self._tcp_store = TCPStore
        self.store = self._client(c.rdzv_timeout)
        self.host = socket.gethostname()
        self._watcher: threading.Thread | None = None
        self._watch_store = None
        self._ended: set[int] = set()
        self._lost = False  # the store on node 0 stopped answering while an attempt ended

    def _client(self, timeout: float):
        from ndist.runtime import DistError

        try:
            return self._tcp_store(*self._store_args, is_master=False, timeout=timeout, secret=self.secret)
        except DistError as err:
            raise LaunchError(
                f"node {self.config.node_rank}: cannot reach the job's store on node 0 at "
                f"{self.addr}:{self.port}: {err}"
            ) from None

    def _key(self, attempt: int, *parts) -> str:
        return "/".join((_PREFIX, str(attempt), *map(str, parts)))

    def next_round(self, attempt: int) -> Round:
        from ndist.runtime import DistTimeoutError

        c = self.config
        # The nonce tells two agents on one host with the same --node-rank apart.
        me = json.dumps({"host": self.host, "nproc": c.nproc_per_node, "agent": os.urandom(8).hex()}).encode()
        got = self.store.compare_set(self._key(attempt, "node", c.node_rank), b"", me)
        if got != me:
            other = json.loads(got)
            raise LaunchError(
                f"--node-rank {c.node_rank} is already taken by the agent on host {other['host']!r}: "
                f"give every node a distinct --node-rank in 0..{c.nnodes - 1}"
            )
        keys = [self._key(attempt, "node", n) for n in range(c.nnodes)]
        try:
            self.store.wait(keys, timeout=c.rdzv_timeout)
        except DistTimeoutError:
            missing = [n for n, k in enumerate(keys) if not self.store.check([k])]
            raise LaunchError(
                f"rendezvous timed out after {c.rdzv_timeout:g} s: nodes {missing} of {c.nnodes} did not join "
                f"(start ndistrun on them with --node-rank and --master-addr {self.addr} --master-port {self.port})"
            ) from None
        infos = [json.loads(v) for v in self.store.multi_get(keys)]
        offset = sum(i["nproc"] for i in infos[: c.node_rank])
        world = sum(i["nproc"] for i in infos)
        self._start_watcher(attempt)
        log.info("node %d of %d joined: ranks %d..%d of %d", c.node_rank, c.nnodes, offset, offset + c.nproc_per_node - 1, world)
        return Round(world, offset, self.addr, self.port)

    # -------------------------------------------------------- watching peers
    def _start_watcher(self, attempt: int) -> None:
        self._stop_watcher()
        self._watch_key = self._key(attempt, "wake", self.config.node_rank)
        self._watch_store = self._client(self.config.rdzv_timeout)
        self._watcher = threading.Thread(
            target=self._watch, args=(self._watch_store, self._watch_key, self.wake_fd), name="ndistrun-watch", daemon=True
        )
        self._watcher.start()

    @staticmethod
    def _watch(store, key: str, wake_fd: int | None) -> None:
        """Wait for this node's wake key: "stop" (another node failed) wakes the monitor loop."""
        from ndist.runtime import DistError, DistTimeoutError

        from ._workers import WAKE_STOP

        while True:
            try:
                store.wait([key], timeout=3600)
                value = store.get(key)
                break
            except DistTimeoutError:
                continue
            except (DistError, OSError):
                return  # the store went away: the job is over
        if value == b"stop" and wake_fd is not None:
            try:
                os.write(wake_fd, bytes([WAKE_STOP]))
            except OSError:
                pass
        store.close()

    def _stop_watcher(self) -> None:
        if self._watcher is not None:
            try:
                self.store.compare_set(self._watch_key, b"", b"done")
            except Exception:  # noqa: BLE001 - the store is gone: the watcher ends by itself
                pass
            self._watcher.join(5)
            self._watcher = None
        if self._watch_store is not None:
            self._watch_store.close()
            self._watch_store = None

    def _wake_all(self, attempt: int) -> None:
        for n in range(self.config.nnodes):
            self.store.compare_set(self._key(attempt, "wake", n), b"", b"stop")

    # -------------------------------------------------------- outcomes
    def _end(self, attempt: int, outcome: str) -> None:
        self._stop_watcher()
        if attempt in self._ended:
            return
        self._ended.add(attempt)
        self.store.set(self._key(attempt, "end", self.config.node_rank), outcome)
        self.store.add(self._key(attempt, "ended"), 1)

    def report_success(self, attempt: int) -> None:
        self._end(attempt, "succeeded")
        self._wait_all_ended(attempt)

    def report_failure(self, attempt: int, failure) -> None:
        def report() -> None:
            self._stop_watcher()  # before "stop" is set: it must not wake our next attempt
            if failure is not None:
                self.store.compare_set(self._key(attempt, "failed"), b"", json.dumps(failure.to_json()).encode())
            self._wake_all(attempt)
            self._end(attempt, "failed")
            self._wait_all_ended(attempt)

        self._bounded(attempt, report)

    def _bounded(self, attempt: int, fn, default=None):
        """Run ``fn`` (store calls that end an attempt) within ``_END_TIMEOUT`` on a node
        that does not host the store: when the link to node 0 is gone, each call would
        wait the store timeout and the agent would outlive its job by minutes. A store
        that does not answer in time is abandoned (logged), and ``default`` returned."""
        if self.server is not None:
            return fn()  # the store is ours: it answers
        if self._lost:
            return default
        box: dict = {}

        def run() -> None:
            try:
                box["value"] = fn()
            except BaseException as err:  # noqa: BLE001 - reported below
                box["error"] = err

        thread = threading.Thread(target=run, name="ndistrun-end", daemon=True)
        thread.start()
        thread.join(_END_TIMEOUT)
        if thread.is_alive() or "error" in box:
            self._lost = True
            why = box.get("error") or f"no answer within {_END_TIMEOUT:g} s"
            log.warning("node %d: the job's store on node 0 (%s:%d) is unreachable while ending attempt %d (%s); "
                        "not waiting for the other nodes", self.config.node_rank, self.addr, self.port, attempt, why)
            self._watcher = self._watch_store = None  # daemon threads blocked on the lost store: abandoned
            return default
        return box.get("value", default)

    def report_stop(self, attempt: int) -> None:
        def report() -> None:
            self._stop_watcher()
            try:
                self._wake_all(attempt)
                self._end(attempt, "stopped")
            except Exception:  # noqa: BLE001 - interrupted teardown: the store may be gone
                pass

        self._bounded(attempt, report)

    def remote_failure(self, attempt: int):
        from ._workers import Failure

        def fetch():
            self._end(attempt, "stopped")
            try:
                return self.store.get(self._key(attempt, "failed")) if self.store.check([self._key(attempt, "failed")]) \
                    else None
            finally:
                self._wait_all_ended(attempt)

        raw = self._bounded(attempt, fetch)
        return Failure.from_json(json.loads(raw)) if raw else None

    def _wait_all_ended(self, attempt: int) -> None:
        """Node 0 hosts the store: it leaves only after every node is done with it."""
        if self.server is None:
            return
        keys = [self._key(attempt, "end", n) for n in range(self.config.nnodes)]
        try:
            self.store.wait(keys, timeout=self.config.rdzv_timeout)
        except Exception:  # noqa: BLE001
            log.warning("not every node reported the end of attempt %d; closing the store anyway", attempt)

    def close(self) -> None:
        if not self._lost:
            self._stop_watcher()
        self.store.close()
        if self.server is not None:
            self.server.close()
