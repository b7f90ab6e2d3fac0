"""The mesh of one socket backend: listeners, rendezvous through the store,
authenticated connections per (channel, peer) — TCP, or a Unix socket between
processes of one host.

Each rank listens on port 0 and publishes ``host:port``, its host identity
(hostname + boot id), pid, shared-memory prefix and transport mode under
``sock/peer/<rank>`` in the group's store. Connections start with the job
secret handshake of ``ndist.runtime._net`` and a hello naming channel, rank
and the listener's instance token, so a connection can only reach the
backend instance it was meant for. The listeners' side of that runs in
``_accept``: every handshake at once, each within a total deadline.

Channel 0 carries collectives: one connection per pair that talks, opened by
whichever rank of the pair first needs it (``collective_link``: a schedule talks
to O(log n) peers, so a rank holds O(log n) links, not n - 1), with the pair's
shared-memory paths agreed in its opening (``wire/_link_facts``). Channel 1 carries
point-to-point messages: rank ``i`` sends to ``j`` only on the connection ``i``
opened (one ordered stream per direction), opened on first use.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
import os
import socket
import threading
import time

from .....runtime import DistNetworkError, DistTimeoutError
from .....runtime import _net
from .....runtime._net import host_identity, listen_address, pid_namespace
from . import _link_facts
from ._accept import HANDSHAKE_S, HELLO, HELLO_MAGIC, Acceptor

__all__ = ["Mesh", "COLL", "P2P_CH"]

log = logging.getLogger("ndist.collectives.socket")

COLL, P2P_CH = 0, 1
#: while connecting, how often a rank looks whether the peer it waits for is known dead
_DEAD_CHECK_S = 0.25
_HELLO, _HELLO_MAGIC = HELLO, HELLO_MAGIC
_SOCKBUF = 4 << 20


def _tune(sock: socket.socket) -> None:
    if sock.family != socket.AF_UNIX:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, _SOCKBUF)
        except OSError:
            pass


class Mesh:
    def __init__(self, store, rank: int, size: int, group_name: str, secret: bytes, timeout: float,
                 extra: dict, on_p2p=None, granks=None, losses=None, ring_for=None) -> None:
        self.store = store
        self.rank = rank
        self.size = size
        #: global rank of each group rank: every message and ``.rank`` names global ranks
        self.granks = tuple(granks) if granks is not None else tuple(range(size))
        #: this process's record of its job's losses (``failure/_losses.JobRecord``, handed
        #: down by the backend): with it, connecting to a peer known to be dead fails at once,
        #: naming it (``check_dead``); ``job`` is its key
        self.losses = losses
        self.job = losses.job if losses is not None else None
        self.pidns = pid_namespace()
        self.group_name = group_name
        self.secret = secret
        self.timeout = timeout
        self.hostid = host_identity()
        self.token = os.urandom(16)
        self._on_p2p = on_p2p
        self._cond = threading.Condition()
        #: collective links accepted and not yet taken by the engine: peer -> (socket, facts)
        self._coll: dict[int, tuple] = {}
        #: peers with a collective link (dialled or accepted); peers this rank dials now
        self._linked: set = set()
        self._dialing: set = set()
        #: ``wire/_link_facts``: allocate this rank's ring to a peer (-> bool), and whether this
        #: rank reads same-host peers' memory and offers its own (CMA, ``auto`` mode only)
        self.ring_for = ring_for
        self.cma_mode = extra.get("transport") == "auto" and extra.get("cma") is not None
        self._offers: dict[int, int] = {}  # peer -> flags this rank sent or answered (``wire/_link_facts``)
        self._reads: dict[int, bool] = {}  # peer -> this rank reads its memory (``wire/_link_facts``)
        self._reads_lock = threading.Lock()
        self._p2p_out: dict[int, socket.socket] = {}
        self._p2p_lock = threading.Lock()
        self._peers: dict[int, dict] = {}
        #: global ranks the collective channel waits for now (``collective_link``)
        self.connecting: list = []
        #: ``explain_wait(global ranks) -> str``: a wait for what they publish timed out; the
        #: root cause a timeout notice from one of them told (the backend's: ``_stalls``)
        self.explain_wait = None
        #: members that left (their process exited, or destroyed the group): group rank ->
        #: (how, its host or None); a connection to one fails at once (``check_dead``), in this
        #: group instance only
        self._departed: dict[int, tuple[str, str | None]] = {}
        self._abandoned: bytes | None = None  # the lost notice of ``abandon``
        self._lost: tuple | None = None  # (global rank, host, message) of ``abandon``
        self._told: list[socket.socket] = []  # links given the lost notice (``_tell_abandoned``), closed with the mesh
        self._closed = False
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        bind, advertised = listen_address()
        self._listener.bind((bind, 0))
        self._listener.listen(max(16, size))
        port = self._listener.getsockname()[1]
        # Same-host peers connect through a Unix socket (abstract namespace: nothing
        # on disk to clean up): about half the per-message cost of loopback TCP.
        self._ulistener = None
        unix = None
        if extra.get("transport") != "tcp" and hasattr(socket, "AF_UNIX") and os.path.exists("/proc/self"):
            try:
                self._ulistener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                unix = f"ndist-{self.token.hex()}"
                self._ulistener.bind("\0" + unix)
                self._ulistener.listen(max(16, size))
            except OSError:
                self._ulistener, unix = None, None
        self.info = dict(extra, host=advertised, port=port, hostid=self.hostid, pid=os.getpid(), pidns=self.pidns,
                         hostname=socket.gethostname(), token=self.token.hex(), unix=unix)
        # handshakes run concurrently on one thread, each within a total deadline:
        # a slow or silent stranger cannot hold up a peer's connection
        self._acceptor = Acceptor((self._listener, self._ulistener), secret, self._check_hello, self._take,
                                  name=f"ndist-accept-{group_name}-{rank}")
        store.set(f"sock/peer/{rank}", json.dumps(self.info))

    # ------------------------------------------------------------ peers
    def peer_info(self, rank: int) -> dict | None:
        """What ``rank`` published, if this rank has read it already (None: not yet)."""
        return self._peers.get(rank)

    def peer(self, rank: int) -> dict:
        info = self._peers.get(rank)
        if info is None:
            key = f"sock/peer/{rank}"
            before, self.connecting = self.connecting, [self.granks[rank]]  # (what a wait meanwhile names)
            try:
                self.wait_published(key, rank)
                raw = self.store.get(key)
            except DistTimeoutError as err:
                why = self.explain_wait([self.granks[rank]]) if self.explain_wait is not None else ""
                raise DistTimeoutError(f"rank {self.granks[rank]} of group {self.group_name!r} never published its "
                                       f"address: {err}{why}") from None
            finally:
                self.connecting = before
            info = json.loads(raw)
            self._peers[rank] = info
            if self.job is not None:
                self.losses.remember(self.granks[rank], info)
        return info

    def prefetch(self) -> None:
        """Every member's published facts (the group's set-up needs them all) in one wait
        and one ``multi_get``, not two store round trips per member."""
        ranks = [r for r in range(self.size) if r != self.rank and r not in self._peers]
        if not ranks:
            return
        keys = [f"sock/peer/{r}" for r in ranks]
        before, self.connecting = self.connecting, [self.granks[r] for r in ranks]  # (what a wait names)
        try:
            self.wait_published(keys, ranks)
            raws = self.store.multi_get(keys)
        except DistTimeoutError as err:
            missing = [self.granks[r] for r, k in zip(ranks, keys) if not self.store.check([k])]
            why = self.explain_wait(missing) if self.explain_wait is not None else ""
            raise DistTimeoutError(f"ranks {missing} of group {self.group_name!r} never published their "
                                   f"addresses: {err}{why}") from None
        finally:
            self.connecting = before
        for r, raw in zip(ranks, raws):
            info = json.loads(raw)
            self._peers[r] = info
            if self.job is not None:
                self.losses.remember(self.granks[r], info)

    def wait_published(self, key, rank) -> None:
        """Wait for member ``rank`` to publish ``key`` in the group's store (or each of the
        ``rank`` list its ``key`` of the list), within the group timeout, but fail at once
        (DistNetworkError naming it) if it, or any other member, is known dead: the group is
        broken, and a member that stopped calling after it learnt of that loss elsewhere
        would never publish."""
        keys, ranks = (key, rank) if isinstance(key, list) else ([key], [rank])
        if self.job is None:
            if len(keys) > 1:  # (one key: the caller's get waits)
                self.store.wait(keys, timedelta(seconds=self.timeout))
            return
        if self.store.check(keys):
            return
        end = time.monotonic() + self.timeout
        waited = set(ranks)
        while True:
            if self._lost is not None:  # the group lost a member (``abandon``): it is broken
                grank, host, message = self._lost
                raise DistNetworkError(f"group {self.group_name!r}: rank {grank} ({host}) is lost; {message}",
                                       rank=grank, host=host)
            dead = [r for r in ranks if self.is_dead(r)]
            for r in dead:  # name first a dead member whose key is missing: the one waited for
                if len(ranks) == 1 or not self.store.check([keys[ranks.index(r)]]):
                    self.check_dead(r)
            for r in dead:
                self.check_dead(r)
            for other in range(self.size):
                if other not in waited and other != self.rank:
                    self.check_dead(other)
            left = end - time.monotonic()
            try:
                self.store.wait(keys, timedelta(seconds=max(0.01, min(left, _DEAD_CHECK_S))))
                return
            except DistTimeoutError as err:
                if left <= _DEAD_CHECK_S:
                    missing = str(err).split("; ", 1)[-1]
                    raise DistTimeoutError(f"store wait timed out after {self.timeout:g} s; {missing}") from None

    def host_of(self, rank: int) -> str:
        info = self._peers.get(rank)
        return info.get("hostname", info.get("host")) if info else "?"

    def same_host(self, rank: int) -> bool:
        return self.peer(rank)["hostid"] == self.hostid

    # ------------------------------------------------------------ connect
    def connect(self, peer: int, channel: int, deadline: float) -> socket.socket:
        info = self.peer(peer)
        sock = None
        if info["hostid"] == self.hostid and info.get("unix") and self._ulistener is not None:
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                sock.connect("\0" + info["unix"])
            except OSError as err:  # e.g. another network namespace: use TCP
                log.debug("unix connection to rank %d failed (%s); using TCP", peer, err)
                sock.close()
                sock = None
        gpeer = self.granks[peer]
        if sock is None:
            sock = self._tcp_connect(peer, info, deadline)
        hostname = info.get("hostname") or info.get("host")
        what = f"rank {gpeer} ({hostname}) of group {self.group_name!r}"
        try:
            _tune(sock)
            _net.client_handshake(sock, self.secret, timeout=max(1.0, deadline - time.monotonic()),
                                  what=what, rank=gpeer, host=hostname)
            _net.send_all(sock, _HELLO.pack(_HELLO_MAGIC, channel, self.rank, self.size,
                                            bytes.fromhex(info["token"])))
            sock.settimeout(None)
        except OSError as err:  # the hello: the peer died right after the handshake
            sock.close()
            raise DistNetworkError(f"connecting to {what} failed: {err}", rank=gpeer, host=hostname) from None
        except BaseException:
            sock.close()
            raise
        return sock

    def _tcp_connect(self, peer: int, info: dict, deadline: float) -> socket.socket:
        """TCP to ``peer``, retried until ``deadline`` (a peer still starting refuses too),
        but given up at once when the peer is known to be dead (``check_dead``)."""
        same = info["hostid"] == self.hostid
        host = "127.0.0.1" if same else info["host"]
        gpeer = self.granks[peer]
        piece = _DEAD_CHECK_S if same else 2.0  # between two looks at whether it is dead
        while True:
            self.check_dead(peer)
            try:
                return _net.connect(host, info["port"], min(deadline, time.monotonic() + piece),
                                    what=f"rank {gpeer}", rank=gpeer)
            except (DistTimeoutError, DistNetworkError):
                if time.monotonic() >= deadline:
                    self.check_dead(peer)
                    raise

    def is_dead(self, peer: int) -> bool:
        try:
            self.check_dead(peer)
        except DistNetworkError:
            return True
        return False

    def check_dead(self, peer: int) -> None:
        """Raise DistNetworkError naming ``peer`` when it is known to be dead: its process
        is gone (same host and pid namespace), or this process already recorded its loss."""
        gone = self._departed.get(peer)
        if gone is not None:
            how, told_host = gone
            host = self.host_of(peer)
            if host == "?" and told_host:  # (its address was never read: a rank that waited for its dial)
                host = told_host
            raise DistNetworkError(f"group {self.group_name!r}: cannot connect to rank {self.granks[peer]} ({host}): "
                                   f"{how}", rank=self.granks[peer], host=host)
        if self.job is None:
            return
        info = self._peers.get(peer)
        reason = self.losses.dead_reason(self.granks[peer], info, self.hostid, self.pidns)
        if reason:
            host = (info.get("hostname") or info.get("host")) if info else self.losses.host_of(self.granks[peer])
            raise DistNetworkError(f"group {self.group_name!r}: cannot connect to rank {self.granks[peer]} "
                                   f"({host}): {reason}", rank=self.granks[peer], host=host)

    def _check_hello(self, channel: int, rank: int, size: int, token: bytes) -> str | None:
        if token != self.token or size != self.size:
            return "hello is not for this group instance"
        if channel not in (COLL, P2P_CH) or not 0 <= rank < self.size or rank == self.rank:
            return f"bad hello: channel {channel}, rank {rank}"
        return None

    def _take(self, sock: socket.socket, addr, channel: int, rank: int) -> None:
        """A peer's connection passed the handshake and the hello (the acceptor's thread)."""
        _tune(sock)
        if channel == P2P_CH and self._on_p2p is not None:
            self._on_p2p(rank, sock)
            return
        # the collective channel: the dialer's offer follows the hello; answer it
        try:
            sock.settimeout(HANDSHAKE_S)
            offer = _link_facts.recv_exact(sock, _link_facts.OFFER.size)
        except OSError as err:
            log.debug("collective link from rank %d: no offer (%s)", self.granks[rank], err)
            sock.close()
            return
        with self._cond:
            refuse = rank in self._linked or (rank in self._dialing and self.rank > rank)
            if not refuse:
                self._linked.add(rank)
        if refuse:  # this rank's own dial is (or was) the pair's link
            try:
                sock.sendall(_link_facts.REFUSE)
            except OSError:
                pass
            sock.close()
            return
        facts = _link_facts.answer(self, rank, offer)
        try:
            sock.sendall(_link_facts.reply(facts))
            if self._abandoned is not None:  # this rank's collective channel is broken
                self._tell_abandoned(sock)
            sock.settimeout(None)
        except OSError as err:
            log.debug("collective link from rank %d failed: %s", self.granks[rank], err)
            sock.close()
            with self._cond:
                self._linked.discard(rank)
            return
        with self._cond:
            if self._closed:  # (close() has closed those taken in before)
                sock.close()
                return
            old = self._coll.pop(rank, None)
            self._coll[rank] = (sock, facts)
            self._cond.notify_all()
        if old is not None:
            old[0].close()

    @property
    def linked(self) -> list:
        """Group ranks this rank holds a collective link with (dialled or accepted; for
        introspection and tests)."""
        with self._cond:
            return sorted(self._linked)

    def collective_link(self, peer: int, deadline: float):
        """This rank's collective connection to ``peer``, opened now if it is not yet:
        ``(socket, facts)`` where ``facts`` (``_link_facts.Facts``) says which shared-memory
        paths both ends agreed on. Either side may dial when it first needs the link; if
        both dial at once, the higher rank's dial is the link (its acceptor refuses the
        lower rank's, which then takes the higher rank's from its own acceptor), so no
        side waits on the other's progress through its collectives."""
        with self._cond:
            got = self._coll.pop(peer, None)
            if got is not None:
                return got
            if self._closed:
                raise DistNetworkError(f"group {self.group_name!r}: backend closed while connecting",
                                       rank=self.granks[peer], host=self.host_of(peer))
            dial = peer not in self._linked  # (else the peer's dial is being taken in)
            if dial:
                self._dialing.add(peer)
        self.connecting = [self.granks[peer]]
        try:
            if dial:
                try:
                    sock, facts = self._dial_collective(peer, deadline)
                except BaseException:
                    with self._cond:
                        self._dialing.discard(peer)
                    raise
                with self._cond:
                    self._dialing.discard(peer)
                    if sock is not None:
                        self._linked.add(peer)
                        return sock, facts
            return self._await_collective(peer, deadline)
        finally:
            self.connecting = []

    def _dial_collective(self, peer: int, deadline: float):
        """Dial ``peer``'s collective channel with this rank's offer; ``(None, None)`` when
        it refused (its own dial to this rank is the pair's link)."""
        offer = _link_facts.offer(self, peer)  # before connecting: the peer's acceptor waits for it
        sock = self.connect(peer, COLL, deadline)
        gpeer, host = self.granks[peer], self.host_of(peer)
        try:
            sock.sendall(offer)
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            raw = _link_facts.recv_exact(sock, _link_facts.REPLY.size)
            sock.settimeout(None)
        except OSError as err:
            sock.close()
            self.check_dead(peer)
            raise DistNetworkError(f"group {self.group_name!r}: connecting to rank {gpeer} ({host}) failed: {err}",
                                   rank=gpeer, host=host) from None
        facts = _link_facts.facts(self, peer, raw)
        if facts is None:
            sock.close()
            return None, None
        return sock, facts

    def _await_collective(self, peer: int, deadline: float):
        """Wait for ``peer``'s dial (it refused ours: its own is the link), failing at
        once when it is known dead."""
        with self._cond:
            while True:
                got = self._coll.pop(peer, None)
                if got is not None:
                    return got
                if self._closed:
                    raise DistNetworkError(f"group {self.group_name!r}: backend closed while connecting")
                if self._lost is not None:
                    rank, host, message = self._lost
                    raise DistNetworkError(f"group {self.group_name!r}: rank {rank} ({host}) is lost; {message}",
                                           rank=rank, host=host)
                self.check_dead(peer)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DistTimeoutError(
                        f"group {self.group_name!r} rank {self.granks[self.rank]}: rank {self.granks[peer]} "
                        f"did not connect within the timeout")
                self._cond.wait(min(left, _DEAD_CHECK_S))

    def abandon(self, notice: bytes, lost: tuple | None = None) -> None:
        """The collective channel is broken (a member is lost): collective links not yet
        taken by the engine, and those a peer dials later, get ``notice`` (the engine's
        ABORT ``lost`` frame), so a peer's op fails naming the dead member instead of
        waiting on this rank. ``lost`` (global rank, host, how it was learnt): a wait of
        this rank for a peer's dial fails at once naming it (the dial it waits for may be
        the one just told)."""
        self._abandoned = notice
        with self._cond:
            if lost is not None and self._lost is None:
                self._lost = lost
            socks = [self._coll.pop(k)[0] for k in list(self._coll)]
            self._cond.notify_all()
        for s in socks:
            self._tell_abandoned(s)

    def _tell_abandoned(self, sock: socket.socket) -> None:
        """Send the lost notice of ``abandon`` on collective link ``sock`` and end its
        sending side (``tell_and_keep``)."""
        self.tell_and_keep(sock, self._abandoned)

    def tell_and_keep(self, sock: socket.socket, notice: bytes) -> None:
        """Send ``notice`` (a lost notice) on collective link ``sock`` and end its sending
        side. The socket stays open until the mesh closes: closing it with bytes the peer
        sent still unread would reset the connection, and the reset can reach the peer
        before the notice, so that it names this rank as lost instead of the dead one."""
        try:
            sock.settimeout(1.0)
            sock.sendall(notice)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        with self._cond:
            self._told.append(sock)

    def depart(self, peer: int, how: str, host: str | None = None) -> None:
        """Member ``peer`` left (``how``: it exited, or destroyed the group; ``host``: its host,
        as the member watch knows it): a connection to it fails at once from now on, and a
        wait for its dial wakes to fail now, naming it and its host."""
        self._departed.setdefault(peer, (how, host))
        with self._cond:
            self._cond.notify_all()

    def keep_p2p(self, peer: int, sock: socket.socket) -> None:
        """``sock`` (dialled to ``peer`` on the point-to-point channel, to watch it) becomes
        this rank's stream to ``peer`` unless it has one already: sends use it too."""
        with self._p2p_lock:
            self._p2p_out.setdefault(peer, sock)

    def p2p_socket(self, peer: int, deadline: float) -> socket.socket:
        """This rank's outgoing point-to-point connection to ``peer``."""
        with self._p2p_lock:
            sock = self._p2p_out.get(peer)
            if sock is None:
                if self._closed:
                    raise DistNetworkError(f"backend closed; cannot reach rank {self.granks[peer]}",
                                           rank=self.granks[peer],
                                           host=self.host_of(peer))
                sock = self.connect(peer, P2P_CH, deadline)
                self._p2p_out[peer] = sock
            return sock

    def has_p2p(self, peer: int) -> bool:
        return peer in self._p2p_out

    def close(self) -> None:
        with self._cond:
            self._closed = True
        self._acceptor.close()
        listeners = [self._listener] + ([self._ulistener] if self._ulistener is not None else [])
        for s in [*listeners, *self._p2p_out.values(), *(c[0] for c in self._coll.values()), *self._told]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        with self._cond:
            self._cond.notify_all()
