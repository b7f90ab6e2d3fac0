"""TCPStoreServer: the key-value server behind ``TCPStore``.

One daemon thread accepts connections; each authenticated client gets a
daemon thread that serves its requests in order. Waits (``get``, ``wait``,
``multi_get``, ``WAIT_WORKERS``) block only the thread of the client that
asked, on a condition variable with the client's deadline, so a waiting rank
never delays another one. Every connection begins with the job-secret
handshake; a client that fails it is logged and dropped before it can read
or write a key. ``close()`` wakes every waiter and closes every connection,
so clients see "store server ... closed the connection" instead of hanging.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time

from .._errors import DistNetworkError
from .._net import job_secret, server_handshake
from ._wire import FrameError, Op, Status, recv_frame, send_frame

__all__ = ["TCPStoreServer"]

log = logging.getLogger("ndist.runtime.store")

#: seconds a client has to complete the handshake, in all (one thread per client:
#: a slow or silent one delays nobody else, and holds its thread this long at most)
_HANDSHAKE_S = 10.0


class _Closed(Exception):
    pass


class _KeySpace:
    """The data of one server, shared by all of its client threads."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.cond = threading.Condition()
        self.workers = 0
        self.clients: dict[int, str] = {}  # authenticated connections open now -> "host:pid" of the client
        self.closed = False

    def _wait_until(self, ready, deadline: float) -> bool:
        # Caller holds self.cond. True when ready() became true, False on timeout.
        while not ready():
            if self.closed:
                raise _Closed()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.cond.wait(left)
        return True

    def wait_keys(self, keys: list[str], deadline: float) -> list[str]:
        """Wait for ``keys``; return those still missing at the deadline ([] on success)."""
        with self.cond:
            if self._wait_until(lambda: all(k in self.data for k in keys), deadline):
                return []
            return [k for k in keys if k not in self.data]

    def changed(self) -> None:
        self.cond.notify_all()


def _ms_deadline(raw: bytes) -> float:
    return time.monotonic() + int(raw) / 1000.0


class TCPStoreServer:
    """A standalone store server on ``host:port`` (``port=0`` picks a free port).

    ``TCPStore(is_master=True)`` runs one in-process; ``ndistrun`` hosts one
    for the whole job. ``secret`` defaults to the job secret (``NDIST_SECRET``).
    ``listener`` adopts a socket that is already bound and listening
    (``host`` and ``port`` then only name it); the server closes it.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        secret: bytes | str | None = None,
        backlog: int = 1024,
        *,
        listener: socket.socket | None = None,
    ):
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise ValueError(f"port: expected an int in 0..65535, got {port!r}")
        self.host = host
        self._secret = job_secret(secret)
        self._ks = _KeySpace()
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        # ``listener``: a socket already bound and listening (``ndistrun`` binds
        # it before it starts the ranks, and imports the store only afterwards).
        self._listener = listener if listener is not None else self._bind(host, port, backlog)
        self.port: int = self._listener.getsockname()[1]
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, name=f"ndist-store-server:{self.port}", daemon=True)
        self._thread.start()
        log.info("store server listening on %s:%d", host, self.port)

    @staticmethod
    def _bind(host: str, port: int, backlog: int) -> socket.socket:
        try:
            infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror as err:
            raise DistNetworkError(f"cannot start the store server: host {host!r} does not resolve: {err}", host=host) from None
        family, _, _, _, addr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(backlog)
        except OSError as err:
            sock.close()
            if err.errno == errno.EADDRINUSE:
                raise DistNetworkError(
                    f"cannot start the store server on {host}:{port}: address already in use "
                    f"(another process listens on port {port}; pick another port or 0 for a free one)",
                    host=host,
                ) from None
            raise DistNetworkError(f"cannot start the store server on {host}:{port}: {err}", host=host) from None
        return sock

    # ------------------------------------------------------------ lifetime
    @property
    def num_workers(self) -> int:
        """How many clients have announced themselves (``TCPStore`` instances connected)."""
        with self._ks.cond:
            return self._ks.workers

    @property
    def num_connections(self) -> int:
        """Authenticated client connections open right now."""
        with self._ks.cond:
            return len(self._ks.clients)

    def connected_clients(self) -> list[str]:
        """``host:pid`` of every open client connection (one entry per connection)."""
        with self._ks.cond:
            return sorted(self._ks.clients.values())

    def wait_idle(self, timeout: float, ignore: str | None = None) -> bool:
        """Wait until every client has disconnected, except those of process ``ignore``
        (``host:pid``), or ``timeout`` seconds passed; True if idle."""
        deadline = time.monotonic() + timeout
        ks = self._ks
        with ks.cond:
            try:
                return ks._wait_until(lambda: all(c == ignore for c in ks.clients.values()), deadline)
            except _Closed:
                return True

    def close(self) -> None:
        """Stop accepting, wake every waiter and shut every connection down (its serving thread
        closes it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._ks.cond:
            self._ks.closed = True
            self._ks.changed()
        for s in [self._listener]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        with self._conns_lock:
            conns = list(self._conns)
            self._conns.clear()
        # each connection's serving thread, woken by the shutdown, closes it (``_serve``): a close
        # here would race that thread's recv, which could then read a descriptor number reused
        # meanwhile (ThreadSanitizer's report, docs/native.md "Thread safety")
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if threading.current_thread() is not self._thread:
            self._thread.join(5)
        log.info("store server on %s:%d closed", self.host, self.port)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"<TCPStoreServer {self.host}:{self.port}{' closed' if self._closed else ''}>"

    # ------------------------------------------------------------ serving
    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, peer = self._listener.accept()
            except OSError:
                if self._closed:
                    return
                time.sleep(0.01)  # e.g. EMFILE: do not spin
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(conn, peer), name="ndist-store-client", daemon=True).start()

    def _serve(self, conn: socket.socket, peer) -> None:
        with self._conns_lock:
            if self._closed:
                conn.close()
                return
            self._conns.add(conn)
        try:
            try:
                server_handshake(conn, self._secret, timeout=_HANDSHAKE_S, what=f"client {peer[0]}:{peer[1]}")
            except DistNetworkError as err:  # (a wrong secret is a DistAuthenticationError)
                log.warning("store server %s:%d refused a client from %s: %s", self.host, self.port, peer, err)
                return
            key = id(conn)
            with self._ks.cond:
                self._ks.clients[key] = f"{peer[0]}:?"  # until the client's HELLO names its process
            try:
                self._serve_requests(conn, peer, key)
            finally:
                with self._ks.cond:
                    self._ks.clients.pop(key, None)
                    self._ks.changed()
        finally:
            with self._conns_lock:
                self._conns.discard(conn)
            try:
                conn.close()
            except OSError:
                pass

    def _serve_requests(self, conn: socket.socket, peer, key: int) -> None:
        while True:
            try:
                code, args = recv_frame(conn)
            except FrameError as err:
                log.warning("store server: dropping client %s: %s", peer, err)
                return
            except OSError:
                return
            try:
                status, reply = self._handle(code, args, key)
            except _Closed:
                return
            except (ValueError, UnicodeDecodeError, IndexError) as err:
                status, reply = Status.ERROR, [f"bad request {code}: {err}".encode()]
            try:
                send_frame(conn, status, reply)
            except OSError:
                return

    def _handle(self, code: int, a: list[bytes], key: int) -> tuple[int, list[bytes]]:
        ks = self._ks
        if code == Op.GET or code == Op.MULTI_GET:
            keys = [k.decode() for k in a[1:]]
            missing = ks.wait_keys(keys, _ms_deadline(a[0]))
            if missing:
                return Status.TIMEOUT, [k.encode() for k in missing]
            with ks.cond:
                try:
                    return Status.OK, [ks.data[k] for k in keys]
                except KeyError as err:  # deleted between wait and read
                    return Status.TIMEOUT, [str(err.args[0]).encode()]
        if code == Op.WAIT:
            missing = ks.wait_keys([k.decode() for k in a[1:]], _ms_deadline(a[0]))
            return (Status.TIMEOUT, [k.encode() for k in missing]) if missing else (Status.OK, [])
        with ks.cond:
            if code == Op.SET:
                ks.data[a[0].decode()] = a[1]
                ks.changed()
                return Status.OK, []
            if code == Op.MULTI_SET:
                for i in range(0, len(a), 2):
                    ks.data[a[i].decode()] = a[i + 1]
                ks.changed()
                return Status.OK, []
            if code == Op.ADD:
                key = a[0].decode()
                try:
                    value = int(ks.data.get(key, b"0")) + int(a[1])
                except ValueError:
                    return Status.ERROR, [f"add: the value at key {key!r} is not an integer".encode()]
                ks.data[key] = str(value).encode()
                ks.changed()
                return Status.OK, [ks.data[key]]
            if code == Op.COMPARE_SET:
                key, expected, desired = a[0].decode(), a[1], a[2]
                current = ks.data.get(key)
                if (current is None and expected == b"") or current == expected:
                    ks.data[key] = desired
                    ks.changed()
                    return Status.OK, [desired]
                return Status.OK, [current if current is not None else expected]
            if code == Op.APPEND:
                key = a[0].decode()
                ks.data[key] = ks.data.get(key, b"") + a[1]
                ks.changed()
                return Status.OK, []
            if code == Op.CHECK:
                return Status.OK, [b"1" if all(k.decode() in ks.data for k in a) else b"0"]
            if code == Op.DELETE:
                return Status.OK, [b"1" if ks.data.pop(a[0].decode(), None) is not None else b"0"]
            if code == Op.NUM_KEYS:
                return Status.OK, [str(len(ks.data)).encode()]
            if code == Op.HELLO:  # args: "host:pid" of the client, b"1" if it counts as a worker
                if a:
                    ks.clients[key] = a[0].decode(errors="replace")
                if len(a) < 2 or a[1] == b"1":
                    ks.workers += 1
                ks.changed()
                return Status.OK, []
            if code == Op.PING:
                return Status.OK, []
            if code == Op.WAIT_WORKERS:
                n = int(a[1])
                if ks._wait_until(lambda: ks.workers >= n, _ms_deadline(a[0])):
                    return Status.OK, [str(ks.workers).encode()]
                return Status.TIMEOUT, [str(ks.workers).encode()]
        return Status.ERROR, [f"unknown store op {code}".encode()]
