"""Rendezvous of the agents, through the store the launcher hosts.

Single node: the agent starts a ``TCPStoreServer`` on loopback (a free port
unless ``--master-port``), a fresh one for every attempt so a restarted
group never sees the keys of the one before; that is all. Its socket is
bound before the ranks start and the server started right after, so the
import of ``ndist.runtime`` overlaps the ranks' own start-up.

Several nodes: the agent of node 0 hosts one ``TCPStoreServer`` on
``--master-port`` (all interfaces; every connection must prove the shared
``NDIST_SECRET``) for the whole job. For attempt ``k`` every agent claims
``ndistrun/k/node/<node_rank>`` with its host and local world size
(``compare_set``, so two agents claiming one node rank is an error), waits
for all nodes, and derives the world size and its first global rank from
the node ranks in order; a node whose ranks cannot start (its script is missing
there) says so in its claim, and every node refuses the job with that reason. A
failing node publishes its root cause under
``ndistrun/k/failed`` and sets every node's ``ndistrun/k/wake/<node>`` to
``stop``; a watcher thread in each agent waits on its own wake key and wakes
the monitor loop, which stops the local ranks (an agent ending the attempt
sets its key to ``done`` to release its watcher). Node 0 keeps the store up until every node reported its end of the
attempt; after a failure at most ``--term-timeout`` + 10 s (a node that has not
reported by then is dead or cut off). Ranks use the same store under their own keys; the runtime keys
them by ``NDIST_RESTART_COUNT``.

With ``--on-failure continue`` (every node must give the same ``--on-failure`` and
``--min-nproc``) the rendezvous also keeps the job's tally of lost ranks
(``_outcome``). A node publishes each rank it loses under ``ndistrun/k/lost/<rank>``
and counts it in ``ndistrun/k/nlost``; the one whose count leaves fewer than
``--min-nproc`` ranks able to finish sets ``ndistrun/k/outcome`` to ``failed`` and
wakes every node (the ``stop`` above). A node whose ranks have all ended adds those
that exited 0 to ``ndistrun/k/nok``; the one that brings it to ``--min-nproc`` sets
the outcome to ``succeeded``. Every agent then waits for the outcome (node 0 also
counts the ranks of a node whose agent vanished as lost) and ends the attempt.

The ranks' ``MASTER_ADDR:MASTER_PORT`` is node 0's address and a port free on it
(``Round.torch_port``, picked by node 0's agent for every attempt, as torchrun does), not
the store: a program's own rank 0 may host a store there, as torch's default
``env://`` rendezvous does. ndist's rendezvous uses ``NDIST_STORE``.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass

from ._outcome import JobOutcome, too_few_left
from ._workers import Failure

__all__ = ["LaunchError", "Round", "make_rendezvous"]

log = logging.getLogger("ndist.launch")

_PREFIX = "ndistrun"
#: how long a node other than node 0 tries to report the end of an attempt to the store
_END_TIMEOUT = 15.0
#: after an attempt failed, how long node 0 waits for the other nodes' reports beyond
#: ``--term-timeout`` (a live node stops its ranks within that, then reports at once)
_END_GRACE = 10.0
#: the longest single wait of an agent's watcher on the store (see ``_watch``)
_WATCH_POLL = 1.0
#: the store timeout of the client that tells the store how each rank ended (``_ends``)
_ENDS_STORE_TIMEOUT = 10.0


class LaunchError(Exception):
    """The job cannot start or rendezvous as configured; the CLI prints the message."""


@dataclass(frozen=True)
class Round:
    world_size: int
    rank_offset: int
    master_addr: str  # the launcher's store (the ranks' NDIST_STORE)
    master_port: int
    torch_port: int  # the ranks' MASTER_PORT: free on node 0, for a store rank 0 may host (torch's env://)


def _free_port() -> int:
    """A port free on every interface now (bound, read, released), as torchrun picks its
    ``MASTER_PORT``: rank 0's TCPStore binds it a moment later."""
    with _listen("", 0) as sock:
        return sock.getsockname()[1]


def make_rendezvous(config, secret: str, wake_fd: int | None = None):
    """The rendezvous for ``config``; ``wake_fd`` gets ``WAKE_STOP`` when another node fails."""
    if config.single_node:
        return _LocalRendezvous(config, secret)
    return _StoreRendezvous(config, secret, wake_fd)


class _LocalRendezvous:
    """One node: a fresh store for every attempt. Its socket is bound before
    the ranks start (they get the port), the server (and ``ndist.runtime``
    with it) is brought up while they boot; connections wait in the backlog."""

    def __init__(self, config, secret: str) -> None:
        self.config = config
        self.secret = secret
        self.server = None
        self.listener = None
        self.addr = config.master_addr or "127.0.0.1"

    def next_round(self, attempt: int) -> Round:
        self.close()
        self._nlost = 0
        self.listener = _listen(self.addr, self.config.master_port or 0)
        return Round(self.config.nproc_per_node, 0, self.addr, self.listener.getsockname()[1], _free_port())

    def serve(self) -> None:
        from ndist.runtime.store import TCPStoreServer

        listener, self.listener = self.listener, None
        self.server = TCPStoreServer(self.addr, listener.getsockname()[1], self.secret, listener=listener)

    def store_opener(self):
        """A function that opens a client of this attempt's store (``_ends``: told how each rank ended)."""
        from ndist.runtime.store import TCPStore

        addr, port, secret = self.addr, self.server.port, self.secret
        return lambda: TCPStore(addr, port, is_master=False, timeout=_ENDS_STORE_TIMEOUT, secret=secret)

    def report_success(self, attempt: int) -> None:
        pass

    def report_failure(self, attempt: int, failure) -> None:
        pass

    def report_stop(self, attempt: int, signum: int | None = None) -> None:
        pass

    def remote_outcome(self, attempt: int):
        return None

    def report_loss(self, attempt: int, failure) -> bool:
        """``--on-failure continue``: count a lost rank; True when too few are left to go on."""
        self._nlost += 1
        return too_few_left(self.config.nproc_per_node, self._nlost, self.config.min_nproc)

    def report_replacement(self, attempt: int, failure) -> None:
        """``--on-failure replace``: a process runs in ``failure``'s place; on one node the
        summary takes it from the group's result."""

    def settle(self, attempt: int, result, poll) -> JobOutcome:
        """``--on-failure continue``: the attempt's outcome, once the local ranks have all ended."""
        c = self.config
        state = "succeeded" if result.state != "failed" and result.ok >= c.min_nproc else "failed"
        lost = sorted(result.failures, key=lambda f: f.rank)
        replaced = sorted(result.replaced, key=lambda f: (f.rank, f.replacement))
        return JobOutcome(state, c.nproc_per_node, c.min_nproc, ok=result.ok, lost=lost, replaced=replaced)

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        if self.server is not None:
            self.server.close()
            self.server = None


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: a free port); ``LaunchError`` if impossible."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as err:
        raise LaunchError(f"cannot host the job's store: --master-addr {host!r} does not resolve ({err})") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(1024)
    except OSError as err:
        sock.close()
        why = "address already in use (pick another --master-port, or none for a free one)" if err.errno == errno.EADDRINUSE else err
        raise LaunchError(f"cannot host the job's store on {host}:{port}: {why}") from None
    return sock


class _StoreRendezvous:
    """Several nodes: node 0 hosts the store for the whole job; see the module docstring."""

    def __init__(self, config, secret: str, wake_fd: int | None) -> None:
        from ndist.runtime.store import TCPStore, TCPStoreServer

        from ._config import DEFAULT_MULTINODE_PORT

        self.wake_fd = wake_fd
        c = self.config = config
        self.secret = secret
        self.addr = c.master_addr or "127.0.0.1"
        self.port = c.master_port or DEFAULT_MULTINODE_PORT
        self.server = None
        if c.node_rank == 0:  # all interfaces: every connection must prove NDIST_SECRET
            self.server = TCPStoreServer("", self.port, secret, listener=_listen("", self.port))
        connect_to = "127.0.0.1" if self.server is not None else self.addr
        self._store_args = (connect_to, self.port)
        self._tcp_store = TCPStore
        try:
            self.store = self._client(c.rdzv_timeout)
        except BaseException:
            if self.server is not None:
                self.server.close()
            raise
        self.host = socket.gethostname()
        self._watcher: threading.Thread | None = None
        self._watch_store = None
        self._ended: set[int] = set()
        self._lost = False  # node 0's store stopped answering while an attempt ended (see _bounded)
        self._idents: list = []  # each node's agent as the store server names its connections
        self._ranges: list[tuple[int, int]] = []  # each node's (first global rank, ranks)
        self._world = 0
        self._gone: set[int] = set()  # nodes whose agent vanished (node 0, --on-failure continue)

    def serve(self) -> None:
        pass  # node 0's server is up from the start: the other agents need it to rendezvous

    def _client(self, timeout: float):
        from ndist.runtime import DistError

        try:
            return self._tcp_store(*self._store_args, is_master=False, timeout=timeout, secret=self.secret)
        except DistError as err:
            raise LaunchError(
                f"node {self.config.node_rank}: cannot reach the job's store on node 0 at "
                f"{self.addr}:{self.port}: {err}"
            ) from None

    def store_opener(self):
        """A function that opens a client of the job's store (``_ends``: told how each rank ended)."""
        return lambda: self._client(min(self.config.rdzv_timeout, _ENDS_STORE_TIMEOUT))

    def _key(self, attempt: int, *parts) -> str:
        return "/".join((_PREFIX, str(attempt), *map(str, parts)))

    def next_round(self, attempt: int) -> Round:
        from ndist.runtime import DistTimeoutError

        c = self.config
        self.store.set_timeout(c.rdzv_timeout)
        # The nonce tells two agents on one host with the same --node-rank apart.
        # "ident": how node 0's store server names this agent's connections (host:pid)
        info = {"host": self.host, "nproc": c.nproc_per_node, "agent": os.urandom(8).hex(),
                "ident": f"{self.host}:{os.getpid()}", "on_failure": c.on_failure, "min_nproc": c.min_nproc,
                "problem": c.entry_problem}
        if c.node_rank == 0:  # its ranks start at global rank 0, whose torch env:// store binds this port
            info["torch_port"] = _free_port()
        me = json.dumps(info).encode()
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
        self._idents = [i.get("ident") for i in infos]
        # From here on, a lost store (node 0 gone) must not hold this agent for
        # the whole rendezvous timeout.
        self.store.set_timeout(min(c.rdzv_timeout, 10.0))
        offset = sum(i["nproc"] for i in infos[: c.node_rank])
        world = sum(i["nproc"] for i in infos)
        self._world = world
        self._ranges = [(sum(i["nproc"] for i in infos[:n]), infos[n]["nproc"]) for n in range(c.nnodes)]
        problem = self._config_problem(infos, world)
        if problem:  # every agent sees the same infos, so every one refuses
            self._end(attempt, "refused")
            self._wait_all_ended(attempt, self._after_failure(), failed=True)
            raise LaunchError(problem)
        self._start_watcher(attempt)
        log.info("node %d of %d joined: ranks %d..%d of %d", c.node_rank, c.nnodes, offset, offset + c.nproc_per_node - 1, world)
        return Round(world, offset, self.addr, self.port, infos[0]["torch_port"])

    def _config_problem(self, infos: list, world: int) -> str | None:
        """What is wrong with the job, now that every node's options are known: a node whose
        ranks cannot start (its script is missing there), or failure options that differ."""
        c = self.config
        for n, i in enumerate(infos):
            if i.get("problem"):
                return f"node {n} ({i['host']}) cannot start its ranks: {i['problem']}"
        for n, i in enumerate(infos):
            theirs = (i.get("on_failure", "stop"), i.get("min_nproc", 1))
            if theirs != (c.on_failure, c.min_nproc):
                return (f"--on-failure/--min-nproc: every node must give the same values; node {c.node_rank} has "
                        f"{c.on_failure} {c.min_nproc}, node {n} has {theirs[0]} {theirs[1]}")
        if c.min_nproc > world:
            return (f"--min-nproc: expected an integer in 1..{world} (the job's ranks on {c.nnodes} nodes), "
                    f"got {c.min_nproc}")
        return None

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
                # Short waits: node 0's store server reads a connection only between requests, so
                # it notices this agent's death (and stops counting it as connected) within one.
                store.wait([key], timeout=_WATCH_POLL)
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
        if self._watcher is not None and self._watcher.is_alive():
            try:  # release our watcher; keep a "stop" another node may have set
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

    def _quietly(self, fn, *args):
        from ndist.runtime import DistError

        try:
            return fn(*args)
        except (DistError, OSError) as err:
            log.warning("node %d: the job's store on node 0 is gone (%s)", self.config.node_rank, err)
            return None

    # -------------------------------------------------------- outcomes
    def _end(self, attempt: int, outcome: str) -> None:
        # Setting the end key must be this node's last use of the store in the
        # attempt: node 0 may close it as soon as every node has set its key.
        self._stop_watcher()
        if attempt in self._ended:
            return
        self._ended.add(attempt)
        self._quietly(self.store.set, self._key(attempt, "end", self.config.node_rank), outcome)

    def report_success(self, attempt: int) -> None:
        self._end(attempt, "succeeded")
        self._wait_all_ended(attempt)

    def report_failure(self, attempt: int, failure) -> None:
        def report() -> None:
            self._stop_watcher()  # before the wake keys are set: it must not wake our next attempt
            if failure is not None:
                info = json.dumps(failure.to_json()).encode()
                self._quietly(self.store.compare_set, self._key(attempt, "failed"), b"", info)
            self._quietly(self._wake_all, attempt)
            self._end(attempt, "failed")
            self._wait_all_ended(attempt, self._after_failure(), failed=True)

        self._bounded(attempt, report)

    def report_stop(self, attempt: int, signum: int | None = None) -> None:
        """This agent was interrupted by ``signum``: stop the other nodes too."""
        def report() -> None:
            self._stop_watcher()
            if signum is not None:
                info = json.dumps({"node": self.config.node_rank, "signal": signum}).encode()
                self._quietly(self.store.compare_set, self._key(attempt, "interrupted"), b"", info)
                # (--on-failure continue) agents waiting for the outcome learn it here
                self._quietly(self.store.compare_set, self._key(attempt, "outcome"), b"", b"interrupted")
            self._quietly(self._wake_all, attempt)
            self._end(attempt, "stopped")
            self._wait_all_ended(attempt, min(self.config.rdzv_timeout, self.config.term_timeout + 30))

        self._bounded(attempt, report)

    def _bounded(self, attempt: int, fn, default=None):
        """Run ``fn`` (the store calls that end an attempt) for at most ``_END_TIMEOUT``
        on a node that does not host the store. When the link to node 0 is gone each
        call would wait the store timeout plus its margin, and the agent would outlive
        its ranks by minutes; a store that does not answer in time is abandoned (logged).
        Node 0 hosts the store, which always answers: ``fn`` runs directly there."""
        if self.server is not None:
            return fn()
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

    def remote_outcome(self, attempt: int):
        """Why another node stopped ``attempt``: its ``Failure``, ``(node, signal)``
        when it was interrupted, or None if it did not get to say."""
        from ._workers import Failure

        def fetch():
            self._stop_watcher()
            keys = (self._key(attempt, "failed"), self._key(attempt, "interrupted"))
            got = self._quietly(lambda: [self.store.get(k) if self.store.check([k]) else None for k in keys])
            self._end(attempt, "stopped")
            self._wait_all_ended(attempt, self._after_failure(), failed=True)
            return got

        raw = self._bounded(attempt, fetch)
        if raw and raw[0]:
            return Failure.from_json(json.loads(raw[0]))
        if raw and raw[1]:
            info = json.loads(raw[1])
            return int(info["node"]), int(info["signal"])
        return None

    # -------------------------------------------------------- --on-failure continue
    def report_loss(self, attempt: int, failure) -> bool:
        """Publish a rank this node lost and count it for the job. True when fewer than
        ``--min-nproc`` ranks can still finish: then the outcome is ``failed`` and every
        other node has been woken to stop its ranks (this one stops its own)."""
        from ndist.runtime import DistError

        if self._lost:
            return False  # node 0's store is gone: the ranks here run on; settle() says so
        c = self.config
        try:
            self.store.set(self._key(attempt, "lost", failure.rank), json.dumps(failure.to_json()))
            total = self.store.add(self._key(attempt, "nlost"), 1)
            if not too_few_left(self._world, total, c.min_nproc):
                return False
            self._stop_watcher()  # before the wake keys are set: it must not wake our next attempt
            self.store.compare_set(self._key(attempt, "outcome"), b"", b"failed")
            self._wake_all(attempt)
            return True
        except (DistError, OSError) as err:
            self._lost = True
            log.warning("node %d: the job's store on node 0 (%s:%d) is gone (%s): the ranks here run on, but the "
                        "job's outcome cannot be known", c.node_rank, self.addr, self.port, err)
            return False

    def report_replacement(self, attempt: int, failure) -> None:
        """``--on-failure replace``: publish that a process runs in ``failure``'s place (the
        ``n``-th loss of its rank: ``ndistrun/k/replaced/<rank>/<n>``), for every node's summary."""
        from ndist.runtime import DistError

        if self._lost:
            return
        try:
            self.store.set(self._key(attempt, "replaced", failure.rank, failure.replacement + 1),
                           json.dumps(failure.to_json()))
        except (DistError, OSError) as err:
            self._lost = True
            log.warning("node %d: the job's store on node 0 (%s:%d) is gone (%s)", self.config.node_rank, self.addr,
                        self.port, err)

    def settle(self, attempt: int, result, poll) -> JobOutcome:
        """The job's outcome of ``attempt``, once this node's ranks have all ended; see the
        module docstring. ``poll()`` is called while waiting (it raises on a signal)."""
        from ndist.runtime import DistError, DistTimeoutError

        c = self.config
        self._stop_watcher()
        lost_here = sorted(result.failures, key=lambda f: f.rank)
        unknown = JobOutcome("failed", self._world, c.min_nproc, ok=result.ok, lost=lost_here,
                             replaced=sorted(result.replaced, key=lambda f: (f.rank, f.replacement)), note="the job's store on node 0 is gone: the other nodes' ranks are unaccounted for")
        if self._lost:
            return unknown
        store, key = self.store, self._key
        try:
            if result.state in ("succeeded", "continued"):
                store.set(key(attempt, "ok", c.node_rank), str(result.ok))
                if store.add(key(attempt, "nok"), result.ok) >= c.min_nproc:
                    store.compare_set(key(attempt, "outcome"), b"", b"succeeded")
            while True:  # until enough ranks finished, or too few can; short waits, for signals
                try:
                    store.wait([key(attempt, "outcome")], timeout=0.5)
                    break
                except DistTimeoutError:
                    pass
                poll()
                if self.server is not None:
                    self._count_gone_nodes(attempt)
            state = store.get(key(attempt, "outcome")).decode()
            out = JobOutcome(state, self._world, c.min_nproc, ok=store.add(key(attempt, "nok"), 0))
            for r in range(self._world):
                k = key(attempt, "lost", r)
                if store.check([k]):
                    out.lost.append(Failure.from_json(json.loads(store.get(k))))
            for r in range(self._world if c.replacing else 0):
                for n in range(1, c.max_restarts + 1):
                    k = key(attempt, "replaced", r, n)
                    if not store.check([k]):
                        break
                    out.replaced.append(Failure.from_json(json.loads(store.get(k))))
            for n in range(c.nnodes):
                if store.check([key(attempt, "gone", n)]):
                    out.gone.extend(json.loads(store.get(key(attempt, "gone", n))))
            if state == "interrupted" and store.check([key(attempt, "interrupted")]):
                info = json.loads(store.get(key(attempt, "interrupted")))
                out.node, out.signal = int(info["node"]), int(info["signal"])
        except (DistError, OSError) as err:
            self._lost = True
            log.warning("node %d: the job's store on node 0 (%s:%d) is gone (%s)", c.node_rank, self.addr, self.port, err)
            return unknown
        self._end(attempt, out.state)
        # after a success, other nodes' ranks may still be running (and using the store);
        # a node whose agent is gone is not waited for either way
        timeout = None if out.state == "succeeded" else self._after_failure()
        self._wait_all_ended(attempt, timeout, failed=True)
        return out

    def _count_gone_nodes(self, attempt: int) -> None:
        """Node 0, waiting for a ``continue`` outcome: a node whose agent vanished before its
        ranks all ended (no ``ok`` count, no connection to the store) lost its ranks too."""
        c, store, key = self.config, self.store, self._key
        for n in range(c.nnodes):
            if n == c.node_rank or n in self._gone or store.check([key(attempt, "ok", n)]):
                continue
            if store.check([key(attempt, "end", n)]) or self._agents_connected([n]):
                continue
            self._gone.add(n)
            first, count = self._ranges[n]
            ranks = [r for r in range(first, first + count) if not store.check([key(attempt, "lost", r)])]
            log.warning("node %d's agent is gone before its ranks ended: counting ranks %s as lost", n, ranks)
            store.set(key(attempt, "gone", n), json.dumps(ranks))
            if too_few_left(self._world, store.add(key(attempt, "nlost"), len(ranks)), c.min_nproc):
                store.compare_set(key(attempt, "outcome"), b"", b"failed")
                self._wake_all(attempt)

    def _after_failure(self) -> float:
        """How long node 0 waits for the other nodes to report the end of a failed attempt.

        Every node has been woken: a live one stops its ranks within ``--term-timeout`` and
        reports; one that does not by then is dead or cut off (its own agent gives up on
        the store after ``_END_TIMEOUT``), and waiting for it the whole ``--rdzv-timeout``
        (600 s by default) would only keep this launcher alive after its ranks are gone."""
        return min(self.config.rdzv_timeout, self.config.term_timeout + _END_GRACE)

    def _wait_all_ended(self, attempt: int, timeout: float | None = None, failed: bool = False) -> None:
        """Node 0 hosts the store: it leaves only after every node is done with it.

        ``failed``: the attempt failed; a node whose agent has no connection to the store
        any more (it died) cannot report and is not waited for."""
        if self.server is None:
            return
        from ndist.runtime import DistError, DistTimeoutError

        keys = [self._key(attempt, "end", n) for n in range(self.config.nnodes)]
        deadline = time.monotonic() + (timeout or self.config.rdzv_timeout)
        try:
            while True:
                left = deadline - time.monotonic()
                try:
                    self.store.wait(keys, timeout=max(0.001, min(left, 0.5) if failed else left))
                    return
                except DistTimeoutError:
                    if left <= 0.5 or not failed:
                        raise
                missing = [n for n, k in enumerate(keys) if not self.store.check([k])]
                if missing and not self._agents_connected(missing):
                    log.warning("the agents of nodes %s are gone (no connection to the store); not waiting "
                                "for their end of attempt %d", missing, attempt)
                    return
        except DistError:
            missing = [n for n, k in enumerate(keys) if not self._quietly(self.store.check, [k])]
            log.warning("nodes %s did not report the end of attempt %d; closing the store anyway", missing, attempt)

    def _agents_connected(self, nodes) -> bool:
        """True if any of ``nodes``' agents still has a connection to the store (or we cannot tell)."""
        idents = [self._idents[n] if n < len(self._idents) else None for n in nodes]
        if None in idents:
            return True
        clients = set(self.server.connected_clients())
        return any(i in clients for i in idents)

    def close(self) -> None:
        if not self._lost:  # else the watcher's release would wait on the lost store again
            self._stop_watcher()
        self.store.close()
        if self.server is not None:
            self.server.close()
