"""The member watch: every process of the job watched from ``init_process_group`` on.

A rank learns that another process of its job is gone from one place, before any
data link to it exists and whatever transport its groups use. Each process holds
one watch connection to every other process of the job (a full mesh, authenticated
with the job secret like every connection of ndist, on its own small listener), and
one thread waits on all of them at once:

* **died**: the connection closed without a goodbye (SIGKILL, a crash, ``os._exit``;
  the kernel closes a dead process's sockets at once, on one host and across hosts;
  TCP keep-alive backs this up for a host that vanished);
* **exited**: a goodbye came first, sent by the process's ``atexit`` hook (its
  interpreter ended: the script finished, ``sys.exit``, an uncaught exception, which
  it names);
* **left**: a goodbye sent by ``destroy_process_group`` (it left the job).

A member that published its listener and then refuses the watch connection is gone
too (it exited or died before the watch connected): the goodbye it wrote to the store
on its way out says which, if it had time to write one.

The watch only tells: it calls ``on_loss(rank, host, cause, detail)`` once per lost
process, from its thread, with ``rank`` the process's rank in the job (its rank at
``init_process_group``). What a loss means for each group (fail what waits on it,
revoke the group) is the process group's business (``_group.ProcessGroup.note_loss``).

The same connections carry **notices** the other way: ``tell(notice)`` sends a small
JSON object to every watched peer, which calls ``on_notice(rank, notice)`` on its watch
thread (a peer whose connection is made later gets every notice told so far as it
connects: a notice told while the mesh is still being made reaches every peer) (the runtime uses it when a survivor begins ``shrink_group`` on the default
group: ``_world._World.peer_notice``). Every message on a watch connection is one line:
a kind byte (``B`` goodbye, ``N`` notice), JSON, ``\n``.

The mesh is made in two steps: ``publish`` (listen, write this process's address to the
store) before the rendezvous' join, ``start`` (dial every lower rank, accept every
higher one) after it, so ``init_process_group`` waits for no connection. Rank ``i``
dials ranks ``j < i``: ``n - 1`` sockets per process. No wait on one peer holds back the
verdict on another: the watch thread only accepts and reads; the dials run on a few
dial threads at once, and the probes (below) on probe threads.

Until a higher rank has dialled, this rank **probes** its listener every
``_PROBE_S``: a probe that is refused finds the peer gone. Every ``_IDENTIFY``-th probe
also checks who listens there (the port of a process that died is free for any new
listener to take, a group's data listener say): authenticated like a dial, then a probe
hello that only the peer's own watch answers (``Y``, to its token). Another program,
another job, or a listener of this job that does not answer finds the peer gone. A probe
that times out before that point (a peer too busy to accept yet, its backlog full) is
no verdict: it is tried again. A dial is tried again the same way: only a refusal, or a
listener of another job or program, finds a lower rank gone.

**Members added later** (a heal: ``grow_group`` admits processes that replace lost ones,
``_grow``): a newcomer gets a job rank above every rank the job ever had, so the rule holds:
it dials the members it joins (``members``: their ranks, not ``range(size)``; its peers'
addresses are given, ``peers``), and each member adds it (``add_members``) and probes its
listener until it has dialled. A newcomer's hello that comes before the member has added it
waits (``_early``) until ``add_members``, not refused.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import selectors
import socket
import struct
import sys
import threading
import time
import weakref
from typing import Callable

from . import _net
from ._errors import DIED, EXITED, LEFT, DistAuthenticationError

__all__ = ["MemberWatch"]

log = logging.getLogger("ndist.runtime.watch")

_HELLO = struct.Struct("!4sI16s")  # magic, the dialer's job rank, the listener's token
_MAGIC = b"NDWH"
_PROBE_MAGIC = b"NDWP"  # a probe's hello: the listener answers _PROBE_YES if the token is its own
_PROBE_YES = b"Y"
_BYE = b"B"
_NOTICE = b"N"
_EOL = b"\n"  # every message ends with it (JSON never holds a raw newline)
_HANDSHAKE_S = 10.0
#: how often the listeners of higher ranks that have not dialled yet are probed
_PROBE_S = 0.25
#: a probe's connect and its handshake: longer is a busy peer (no verdict, probed again)
_PROBE_CONNECT_S = 1.0
_PROBE_HANDSHAKE_S = 2.0
#: after the handshake, the peer's watch answers a probe at once (its accept thread runs):
#: no answer within this is another listener of the job on its port
_PROBE_ANSWER_S = 5.0
#: every this-many-th probe of a peer checks who listens (a handshake: more work than a connect)
_IDENTIFY = 4
#: the longest ``close`` waits for the store to take its goodbye: the store's host may be on
#: its way out too, or alive and no longer serving (an MPI rank in ``MPI_Finalize``, waiting
#: for this one), and the exit that writes it must not wait on that
_BYE_STORE_S = 2.0
#: at most this many dials (of lower ranks), and as many probes, at once
_PARALLEL = 4

#: the live watches of this process (the ``atexit`` goodbye and the fork hook use them)
_live: "weakref.WeakSet[MemberWatch]" = weakref.WeakSet()


def _keepalive(sock: socket.socket) -> None:
    """Keep-alive probes after 2 s of silence, every 1 s, 3 of them: a peer whose host
    vanished (no FIN, no RST) is found dead in about 5 s."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for opt, value in (("TCP_KEEPIDLE", 2), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, opt):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
    except OSError:
        pass


def _ending(sock: socket.socket, grace: float) -> bool:
    """Whether the watch connection ``sock`` (its thread reads it) has ended or carries a
    goodbye, now or within ``grace`` s: looked at without reading (``MSG_PEEK``)."""
    try:
        poller = select.poll()  # (not select.select: no limit on the descriptor's number)
        poller.register(sock, select.POLLIN)
        if not poller.poll(int(grace * 1000)):
            return False
        data = sock.recv(1, socket.MSG_PEEK)
    except (BlockingIOError, InterruptedError):
        return False
    except (OSError, ValueError):  # reset, or closed by the watch thread meanwhile: it ended
        return True
    return not data or data.startswith(_BYE)


def _send_bounded(sock: socket.socket, data: bytes, rank: int, peer: int) -> bool:
    """Send ``data`` on a non-blocking watch connection, waiting 0.2 s at most for room;
    whether it all went (a peer that is gone is told by its own loss)."""
    view = memoryview(data)
    deadline = time.monotonic() + 0.2
    try:
        while view:
            try:
                view = view[sock.send(view):]
            except (BlockingIOError, InterruptedError):
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([], [sock], [], left)[1]:
                    raise OSError("its watch connection did not take the notice within 0.2 s") from None
    except OSError as err:
        log.debug("rank %d: a notice to rank %d was not sent: %s", rank, peer, err)
        return False
    return True


class MemberWatch:
    """Watches the other ``size - 1`` processes of one ``init_process_group`` round.

    ``store``: the round's store (already prefixed for the watch); ``on_loss(rank, host,
    cause, detail)``: called once per lost process, on the watch thread; ``on_notice(rank,
    notice)``: called with each notice a peer sent (``tell``), on the watch thread."""

    def __init__(self, store, rank: int, size: int, secret: bytes, timeout: float,
                 on_loss: Callable[[int, str, str, str], None],
                 on_notice: Callable[[int, dict], None] | None = None) -> None:
        """``rank`` may be set later (before ``start``): a newcomer learns it when admitted."""
        self.store = store
        self.rank = rank
        self.size = size
        self.secret = secret
        self.timeout = timeout
        self.on_loss = on_loss
        self.on_notice = on_notice
        self.token = os.urandom(16)
        #: rank -> its published facts (host, port, hostname, token)
        self.peers: dict[int, dict] = {}
        #: rank -> (cause, detail): the losses told, each once
        self.lost: dict[int, tuple[str, str]] = {}
        self._byes: dict[int, tuple[str, str]] = {}  # goodbyes received, before the close that follows
        self._inbox: dict[int, bytes] = {}  # per peer: the start of a message whose end has not come yet
        self._socks: dict[int, socket.socket] = {}
        self._met: set[int] = set()  # the peers whose watch connection was made (they hear a goodbye on it)
        self._lock = threading.Lock()
        self._told = threading.Condition(self._lock)  # notified as each ``on_loss`` returns
        self._done: set[int] = set()  # the ranks whose ``on_loss`` returned
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._closing = False
        self._closed = threading.Event()  # set by ``close``: the dial and probe threads stop
        self._probing: set[int] = set()  # the higher ranks a probe thread is probing now
        self._probe_due: dict[int, float] = {}  # higher rank -> when it is probed next
        self._probe_count: dict[int, int] = {}  # higher rank -> its probes so far
        self._bye: bytes | None = None  # the goodbye of ``close``
        #: every notice ``tell`` sent, as sent: a peer whose connection comes later gets them
        #: then (``_adopt``), so no peer misses one because the mesh was still being made
        self._notices: list[bytes] = []
        #: hellos of higher ranks not (yet) among ``peers``: a newcomer that dialled before this
        #: process added it (``add_members``); adopted then, closed with the watch otherwise
        self._early: dict[int, socket.socket] = {}
        self._thread: threading.Thread | None = None
        bind, advertised = _net.listen_address()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((bind, 0))
        self._listener.listen(max(128, size))  # (probes and dials come in bursts at start)
        self._listener.setblocking(False)
        self._sel.register(self._listener, selectors.EVENT_READ, "accept")
        self.info = {"host": advertised, "port": self._listener.getsockname()[1], "hostname": socket.gethostname(),
                     "token": self.token.hex(), "pid": os.getpid()}
        _live.add(self)

    # ------------------------------------------------------------ set-up
    def publish(self) -> None:
        """Write this process's watch address to the store (before the join)."""
        self.store.set(f"addr/{self.rank}", json.dumps(self.info))

    def start(self, peers: dict[int, dict] | None = None) -> None:
        """After the join (every rank has published): read every member's address (one
        store round trip, here: the store may go with a lost member, the watch must
        not need it), then watch (the watch thread), dial the lower ranks (the dial
        threads) and probe the higher ones until they have dialled (the probe threads).
        ``peers`` (a newcomer): the members it joins, rank -> address, instead of the store's."""
        if peers is None:
            self._load_peers()
        else:
            self.peers.update({r: info for r, info in peers.items() if r != self.rank})
            self.size = max([self.size, self.rank + 1, *(r + 1 for r in self.peers)])
        self._thread = threading.Thread(target=self._run, name=f"ndist-watch-{self.rank}", daemon=True)
        self._thread.start()
        lower = sorted(r for r in self.peers if r < self.rank)
        for i in range(min(_PARALLEL, len(lower))):
            threading.Thread(target=self._dialler, args=(lower,), name=f"ndist-watch-dial-{self.rank}.{i}",
                             daemon=True).start()
        self._start_probers(sum(1 for r in self.peers if r > self.rank))

    def _start_probers(self, higher: int) -> None:
        for i in range(min(_PARALLEL, higher)):
            threading.Thread(target=self._prober, name=f"ndist-watch-probe-{self.rank}.{i}", daemon=True).start()

    def add_members(self, peers: dict[int, dict]) -> None:
        """Watch the processes ``peers`` (rank -> published address; ranks above every
        rank watched so far) from now on: newcomers a heal admitted (``_grow``). Each dials
        this process; until it has, its listener is probed, so one that is gone is told
        like any other loss. Any thread, after ``start``."""
        early = []
        with self._lock:
            if self._closing:
                return
            for r, info in peers.items():
                if r == self.rank or r in self.peers:
                    continue
                self.peers[r] = info
                self.size = max(self.size, r + 1)
                sock = self._early.pop(r, None)
                if sock is not None:
                    early.append((r, sock))
        for r, sock in early:
            self._adopt(r, sock)
        self._start_probers(len(peers))

    def host_of(self, rank: int) -> str:
        info = self.peers.get(rank)
        return str(info.get("hostname") or info.get("host")) if info else "?"

    # ------------------------------------------------------------ the thread
    def _run(self) -> None:
        try:
            self._loop()
        except Exception:  # noqa: BLE001 - the watch must never take the process down
            log.warning("rank %d: the member watch stopped", self.rank, exc_info=True)

    def _dialler(self, lower: list[int]) -> None:
        """A dial thread: dials the lower ranks left in ``lower`` (shared by the dial
        threads), one at a time, until none is left."""
        try:
            while not self._closing:
                try:
                    peer = lower.pop(0)  # (atomic under the GIL)
                except IndexError:
                    return
                self._dial(peer)
        except Exception:  # noqa: BLE001 - the watch must never take the process down
            log.warning("rank %d: a member watch dial stopped", self.rank, exc_info=True)

    def _load_peers(self) -> None:
        ranks = [r for r in range(self.size) if r != self.rank]
        raws = self.store.multi_get([f"addr/{r}" for r in ranks])
        for r, raw in zip(ranks, raws):
            self.peers[r] = json.loads(raw)

    def _dial(self, peer: int) -> None:
        """Connect to the lower rank ``peer``'s watch. Gone only when its listener refuses
        (nobody listens there any more) or what answers is not of this job (its port was
        taken); a connection that times out or fails midway (a peer too busy to answer in
        time) is tried again, so a loaded machine makes no false verdict."""
        info = self.peers[peer]
        what = f"rank {peer} ({self.host_of(peer)})"
        pause = 0.05
        while not self._closing:
            try:
                sock = socket.create_connection((info["host"], info["port"]), timeout=_HANDSHAKE_S)
            except (socket.timeout, TimeoutError):
                continue
            except OSError as err:  # it published, then stopped listening: gone
                self._gone(peer, None, f"its watch connection was refused ({err})")
                return
            try:
                _net.client_handshake(sock, self.secret, timeout=_HANDSHAKE_S, what=what, rank=peer,
                                      host=self.host_of(peer))
                _net.send_all(sock, _HELLO.pack(_MAGIC, self.rank, bytes.fromhex(info["token"])))
            except DistAuthenticationError as err:  # another program or job holds its port
                sock.close()
                self._gone(peer, None, f"its watch port is held by another listener ({err})")
                return
            except Exception as err:  # noqa: BLE001 - timed out, closed, reset: a fresh connect tells
                sock.close()
                log.debug("rank %d: the watch connection to %s failed (%s); trying again", self.rank, what, err)
                self._closed.wait(pause)
                pause = min(2 * pause, 1.0)
                continue
            self._adopt(peer, sock)  # (a listener of this job that is not its watch closes it: lost)
            return

    def _accept(self) -> None:
        while True:
            try:
                sock, _addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            # the handshake on a thread of its own: a slow stranger cannot delay the watch
            threading.Thread(target=self._take, args=(sock,), name=f"ndist-watch-accept-{self.rank}",
                             daemon=True).start()

    def _take(self, sock: socket.socket) -> None:
        try:
            sock.setblocking(True)
            _net.server_handshake(sock, self.secret, timeout=_HANDSHAKE_S, what="a watch peer")
            magic, peer, token = _HELLO.unpack(_net.recv_exact_before(sock, _HELLO.size,
                                                                      time.monotonic() + _HANDSHAKE_S))
        except Exception as err:  # noqa: BLE001 - a stranger, or a peer that died meanwhile
            log.debug("rank %d: a watch connection was refused: %s", self.rank, err)
            sock.close()
            return
        if magic == _PROBE_MAGIC:  # a lower rank asks whether this is its peer's watch
            try:
                if token == self.token and 0 <= peer < self.rank:
                    sock.sendall(_PROBE_YES)
            except OSError:
                pass
            sock.close()
            return
        if magic == _MAGIC and token == self.token and peer > self.rank and peer not in self.peers:
            with self._lock:  # a newcomer this process has not added yet (``add_members``)
                if peer not in self.peers and not self._closing:
                    old, self._early[peer] = self._early.get(peer), sock
                    if old is not None:
                        old.close()
                    return
        if magic != _MAGIC or token != self.token or not (self.rank < peer and peer in self.peers):
            log.debug("rank %d: a watch hello was not for this job round (rank %d)", self.rank, peer)
            sock.close()
            return
        self._adopt(peer, sock)

    def _adopt(self, peer: int, sock: socket.socket) -> None:
        _keepalive(sock)
        sock.setblocking(False)
        with self._lock:
            if self._closing or peer in self.lost:
                if self._bye is not None:  # (closed while this connection was being made)
                    try:
                        sock.setblocking(True)
                        sock.settimeout(0.2)
                        sock.sendall(self._bye)
                    except OSError:
                        pass
                sock.close()
                return
            old = self._socks.pop(peer, None)
            self._socks[peer] = sock
            self._met.add(peer)
            try:
                if old is not None:
                    self._sel.unregister(old)
                self._sel.register(sock, selectors.EVENT_READ, peer)
            except (KeyError, ValueError, OSError):
                pass
            if self._notices:  # (under the lock: ``tell`` sends to it only once this is done)
                _send_bounded(sock, b"".join(self._notices), self.rank, peer)
        if old is not None:
            old.close()
        self._wake_w.send(b"x")  # (the loop's select may not see the new socket yet)

    def _prober(self) -> None:
        """A probe thread: until every higher rank has dialled (or is lost), probes the
        listener of one whose probe is due, that no other probe thread probes now."""
        try:
            while not self._closing:
                now = time.monotonic()
                with self._lock:
                    missing = [r for r in sorted(self.peers)
                               if r > self.rank and r not in self._socks and r not in self.lost]
                    if not missing:
                        return
                    free = [r for r in missing if r not in self._probing]
                    peer = min(free, key=lambda r: self._probe_due.get(r, 0.0)) if free else None
                    due = self._probe_due.get(peer, 0.0) if peer is not None else now + _PROBE_S
                    if peer is not None and due <= now:
                        self._probing.add(peer)
                if peer is None or due > now:
                    self._closed.wait(max(0.0, min(due - now, _PROBE_S)))
                    continue
                try:
                    self._probe(peer)
                finally:
                    with self._lock:
                        self._probing.discard(peer)
                        self._probe_due[peer] = time.monotonic() + _PROBE_S
        except Exception:  # noqa: BLE001 - the watch must never take the process down
            log.warning("rank %d: a member watch probe stopped", self.rank, exc_info=True)

    def _probe(self, peer: int) -> None:
        """Probe the listener of ``peer`` (a higher rank that has not dialled yet): gone when
        it refuses; no verdict when it is slow. Every ``_IDENTIFY``-th probe of a peer also
        checks that what listens there is ``peer``'s watch (its port is free for another
        listener to take once it died): a handshake and the peer's answer to its token."""
        info = self.peers[peer]
        try:
            sock = socket.create_connection((info["host"], info["port"]), timeout=_PROBE_CONNECT_S)
        except (socket.timeout, TimeoutError):
            return  # a busy peer (its backlog full) or a slow network: probed again
        except OSError as err:
            self._probed_gone(peer, f"its watch listener refused a connection ({err})")
            return
        with self._lock:
            count = self._probe_count[peer] = self._probe_count.get(peer, 0) + 1
        try:
            if count % _IDENTIFY == 0:
                self._identify(peer, sock)
        finally:
            sock.close()

    def _identify(self, peer: int, sock: socket.socket) -> None:
        what = f"rank {peer} ({self.host_of(peer)})"
        try:
            _net.client_handshake(sock, self.secret, timeout=_PROBE_HANDSHAKE_S, what=what, rank=peer,
                                  host=self.host_of(peer))
        except DistAuthenticationError as err:
            self._probed_gone(peer, f"its watch port is held by another listener ({err})")
            return
        except Exception as err:  # noqa: BLE001 - timed out, closed or reset mid-way: a fresh probe tells
            log.debug("rank %d: a probe of %s failed midway: %s", self.rank, what, err)
            return
        try:  # a listener of this job that is not the peer's watch closes, or waits for more
            sock.settimeout(_PROBE_ANSWER_S)
            _net.send_all(sock, _HELLO.pack(_PROBE_MAGIC, self.rank, bytes.fromhex(self.peers[peer]["token"])))
            answer = sock.recv(1)
        except OSError:  # timed out, reset: a watch answers its probe at once, then closes
            answer = b""
        if answer != _PROBE_YES:
            self._probed_gone(peer, "its watch port is held by another listener of this job (it did not answer "
                                    f"as rank {peer}'s watch)")

    def _probed_gone(self, peer: int, detail: str) -> None:
        with self._lock:
            if peer in self._socks:  # (it dialled meanwhile, then closed its listener)
                return
        self._gone(peer, None, detail)

    def _loop(self) -> None:
        while not self._closing:
            for key, _ev in self._sel.select(timeout=_PROBE_S):
                if key.data == "accept":
                    self._accept()
                elif key.data is None:
                    try:
                        self._wake_r.recv(4096)
                    except OSError:
                        pass
                else:
                    self._readable(key.data, key.fileobj)

    def _readable(self, peer: int, sock: socket.socket) -> None:
        try:
            data = sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as err:
            data = b""
            log.debug("rank %d: watch connection to rank %d: %s", self.rank, peer, err)
        if data:
            lines = (self._inbox.pop(peer, b"") + data).split(_EOL)
            if lines[-1]:
                self._inbox[peer] = lines[-1]
            for line in lines[:-1]:
                self._message(peer, line)
            return
        rest = self._inbox.pop(peer, b"")
        if rest:
            self._message(peer, rest)
        with self._lock:
            if self._socks.get(peer) is sock:
                del self._socks[peer]
                try:
                    self._sel.unregister(sock)
                except (KeyError, ValueError):
                    pass
        sock.close()
        if self._closing:
            return
        got = self._byes.pop(peer, None)
        cause, detail = got if got is not None else self._check_bye(
            peer, "its watch connection closed without a goodbye")
        self._tell(peer, cause, detail)

    def _message(self, peer: int, line: bytes) -> None:
        """One message from ``peer``: a goodbye (its close follows) or a notice."""
        kind, body = line[:1], line[1:]
        try:
            got = json.loads(body.decode()) if body.strip() else {}
        except ValueError:
            got = None
        if kind == _BYE:
            got = got if isinstance(got, dict) else {}
            self._byes[peer] = (str(got.get("cause", EXITED)), str(got.get("detail", "")))
        elif kind == _NOTICE and isinstance(got, dict) and self.on_notice is not None and not self._closing:
            try:
                self.on_notice(peer, got)
            except Exception:  # noqa: BLE001 - a listener's failure must not stop the watch
                log.warning("rank %d: a notice from rank %d failed", self.rank, peer, exc_info=True)
        else:
            log.debug("rank %d: an unknown watch message from rank %d: %r", self.rank, peer, line[:80])

    def _gone(self, peer: int, cause: str | None, detail: str) -> None:
        """A member refused the watch connection: the goodbye it wrote to the store says
        how it went, if it wrote one."""
        if cause is None:
            cause, detail = self._check_bye(peer, detail)
        self._tell(peer, cause, detail)

    def _check_bye(self, peer: int, detail: str) -> tuple[str, str]:
        try:
            if self.store.check([f"bye/{peer}"]):
                bye = json.loads(self.store.get(f"bye/{peer}"))
                return str(bye.get("cause", EXITED)), str(bye.get("detail", ""))
        except Exception as err:  # noqa: BLE001 - the store may have gone with the peer
            log.debug("rank %d: looking up rank %d's goodbye failed: %s", self.rank, peer, err)
        return DIED, detail

    def _tell(self, peer: int, cause: str, detail: str) -> None:
        with self._lock:
            if peer in self.lost or self._closing:
                return
            self.lost[peer] = (cause, detail)
        log.info("rank %d: rank %d (%s) %s%s", self.rank, peer, self.host_of(peer), cause,
                 f": {detail}" if detail else "")
        try:
            self.on_loss(peer, self.host_of(peer), cause, detail)
        except Exception:  # noqa: BLE001 - a listener's failure must not stop the watch
            log.warning("rank %d: telling the loss of rank %d failed", self.rank, peer, exc_info=True)
        with self._told:
            self._done.add(peer)
            self._told.notify_all()

    # ------------------------------------------------------------ asked by an operation
    def await_loss(self, rank: int, grace: float, timeout: float) -> bool:
        """An operation lost its connection to ``rank``: True once the watch has told its
        loss (``on_loss`` returned: the groups know how it went, died or exited). Waits when
        its watch connection is closed, or closes within ``grace`` s (a process's sockets all
        close as it ends: the watch's verdict is then a moment away), at most ``timeout`` s;
        False at once, or after ``grace``, while the connection stays open (it is alive: it
        left the group, or a connection of the group failed by itself). Any thread."""
        deadline = time.monotonic() + timeout
        with self._lock:
            if rank in self._done:
                return True
            if self._closing or rank not in self.peers:
                return False
            sock = self._socks.get(rank)
        if sock is not None and not _ending(sock, grace):
            return False
        with self._told:  # (no socket: not connected yet, or its loss is being told now)
            while rank not in self._done and not self._closing:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._told.wait(left)
            return rank in self._done

    # ------------------------------------------------------------ notices
    def tell(self, notice: dict) -> list[int]:
        """Send ``notice`` (a JSON object) to every peer connected now; each calls its
        ``on_notice(this rank, notice)``. Never blocks on a peer (0.2 s at most per slow
        one). Returns the ranks it was sent to."""
        line = _NOTICE + json.dumps(notice).encode() + _EOL
        with self._lock:
            if self._closing:
                return []
            self._notices.append(line)  # (a peer connected later gets it from ``_adopt``)
            socks = dict(self._socks)
        return [peer for peer, sock in sorted(socks.items()) if _send_bounded(sock, line, self.rank, peer)]

    # ------------------------------------------------------------ the end
    def close(self, cause: str = LEFT, detail: str = "") -> None:
        """Say goodbye to every watched peer (``cause``: why this process goes) and stop.
        Never blocks on a peer."""
        bye = _BYE + json.dumps({"cause": cause, "detail": detail}).encode() + _EOL
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self._closed.set()
            self._bye = bye
            socks = list(self._socks.values())
            self._socks.clear()
            self._told.notify_all()  # (``await_loss`` gives up)
            # a peer whose connection was made hears the goodbye on it (or has gone: it is
            # told its own way); only one never connected needs the store
            unconnected = any(r != self.rank and r not in self._met and r not in self.lost for r in self.peers)
            early = list(self._early.values())
            self._early.clear()
        for s in early:
            try:
                s.close()
            except OSError:
                pass
        for s in socks:
            try:
                s.setblocking(True)
                s.settimeout(0.2)
                s.sendall(bye)
            except OSError:
                pass
        if unconnected and self._thread is not None:  # a peer still to connect learns it from the store
            self._store_bye(bye[1:])
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(2.0)
        for s in (self._listener, self._wake_r, self._wake_w):
            try:
                s.close()
            except OSError:
                pass
        try:
            self._sel.close()
        except (OSError, ValueError):
            pass
        _live.discard(self)

    def _store_bye(self, line: bytes) -> None:
        """Write the goodbye to the store, waiting ``_BYE_STORE_S`` at most: the write goes
        on a thread of its own, left behind (a daemon) if the store does not answer."""
        def write() -> None:
            try:
                self.store.set(f"bye/{self.rank}", line)
            except Exception as err:  # noqa: BLE001 - best effort: the store may be gone
                log.debug("rank %d: writing the goodbye to the store failed: %s", self.rank, err)

        writer = threading.Thread(target=write, name="ndist-watch-bye", daemon=True)
        try:
            writer.start()
        except RuntimeError:  # (a Python that starts no thread at its shutdown: a peer still
            return            # to connect then finds this process gone without a goodbye)
        writer.join(_BYE_STORE_S)
        if writer.is_alive():
            log.debug("rank %d: the store did not take the goodbye within %g s", self.rank, _BYE_STORE_S)

    def _forget_after_fork(self) -> None:
        """In a forked child: close this process's copies of the watch sockets, so a
        parent that dies is seen dead at once (the child's copy would keep its
        connections open)."""
        self._closing = True
        for s in [*self._socks.values(), self._listener, self._wake_r, self._wake_w]:
            try:
                s.close()
            except OSError:
                pass
        self._socks.clear()


def _exit_detail() -> str:
    err = getattr(sys, "last_value", None)  # set when an exception ended the interpreter
    if err is not None:
        return f"an uncaught {type(err).__name__}: {err}"
    return "its interpreter ended"


@atexit.register
def _say_goodbye() -> None:
    for watch in list(_live):
        watch.close(EXITED, _exit_detail())


def _after_fork_in_child() -> None:
    for watch in list(_live):
        watch._forget_after_fork()
    _live.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
