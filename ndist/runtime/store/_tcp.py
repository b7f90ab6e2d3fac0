"""TCPStore: the client of a ``TCPStoreServer`` (and, on the master, its host).

Each TCPStore keeps one persistent, authenticated connection to the server.
A request is one frame and its reply one frame, under a lock; a second thread
that needs the store while the first one is blocked in a wait gets its own
extra connection (kept for reuse), so two threads of a process can never
deadlock on the shared socket. Waits run on the server with the caller's
deadline; the socket timeout is that deadline plus a margin, so a server that
stopped answering becomes ``DistTimeoutError`` and a server that went away
becomes ``DistStoreError`` naming ``host:port``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import timedelta
from typing import Iterable, Sequence

from .._errors import DistAuthenticationError, DistNetworkError, DistStoreError, DistTimeoutError
from .._net import client_handshake, connect, job_secret
from ._base import DEFAULT_TIMEOUT, Store, as_bytes, as_timedelta, check_key
from ._tcp_server import TCPStoreServer
from ._wire import FrameError, Op, Status, recv_frame, send_frame

__all__ = ["TCPStore"]

log = logging.getLogger("ndist.runtime.store")

_MARGIN = 30.0  # seconds a reply may lag the server-side deadline before we give up on the socket
_RECONNECT = 5.0  # seconds an extra / replacement connection may take once we have been connected


class _Conn:
    __slots__ = ("sock", "lock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lock = threading.Lock()


class TCPStore(Store):
    """A key-value store served over TCP, as ``torch.distributed.TCPStore``.

    ``is_master=True`` starts a ``TCPStoreServer`` on ``host_name:port``
    (``port=0`` picks a free one; read it back from ``.port``) and, with
    ``wait_for_workers`` and ``world_size``, waits until ``world_size`` stores
    (itself included) have connected. Every connection proves the job secret
    (``secret`` or ``NDIST_SECRET``).
    """

    def __init__(
        self,
        host_name: str,
        port: int,
        world_size: int | None = None,
        is_master: bool = False,
        timeout: timedelta | float = DEFAULT_TIMEOUT,
        wait_for_workers: bool = True,
        secret: bytes | str | None = None,
    ) -> None:
        super().__init__(timeout)
        if not isinstance(host_name, str) or not host_name:
            raise ValueError(f"host_name: expected a non-empty str, got {host_name!r}")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise ValueError(f"port: expected an int in 0..65535, got {port!r}")
        if not is_master and port == 0:
            raise ValueError("port: a client TCPStore (is_master=False) needs the server's port, got 0")
        if world_size is not None and (not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1):
            if world_size != -1:
                raise ValueError(f"world_size: expected a positive int or None, got {world_size!r}")
            world_size = None
        self.host = host_name
        self.world_size = world_size
        self._secret = job_secret(secret)
        self._server: TCPStoreServer | None = TCPStoreServer(host_name, port, self._secret) if is_master else None
        self.port: int = self._server.port if self._server else port
        self._pool: list[_Conn] = []
        self._pool_lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False
        self._gone: str | None = None  # why the server is known to be gone: fail fast from then on
        try:
            conn = self._open(time.monotonic() + self.timeout.total_seconds())
            self._request(conn, Op.HELLO, [_ident().encode(), b"1"])
            self._pool.append(conn)
            if is_master and wait_for_workers and world_size is not None:
                self._wait_workers(world_size)
        except BaseException:
            self.close()
            raise

    @property
    def is_master(self) -> bool:
        return self._server is not None

    @property
    def server(self) -> TCPStoreServer | None:
        return self._server

    def __repr__(self) -> str:
        role = "master" if self._server else "client"
        return f"<TCPStore {role} {self.host}:{self.port}>"

    # -------------------------------------------------------------- plumbing
    @property
    def _where(self) -> str:
        return f"store server at {self.host}:{self.port}"

    def _open(self, deadline: float) -> _Conn:
        sock = connect(self.host, self.port, deadline, what="store server")
        _keepalive(sock)
        try:
            client_handshake(sock, self._secret, timeout=max(1.0, min(30.0, deadline - time.monotonic())), what=self._where)
        except DistNetworkError as err:  # a wrong secret, or the server went away meanwhile
            sock.close()
            msg = str(err)
            if self._where not in msg:
                msg = f"{self._where}: {msg}"
            if isinstance(err, DistAuthenticationError) and "NDIST_SECRET" not in msg:
                msg += " (is NDIST_SECRET the same as the job's? or is something else listening there?)"
            raise DistStoreError(msg) from None
        return _Conn(sock)

    def _acquire(self) -> _Conn:
        if self._closed:
            raise DistStoreError(f"TCPStore for {self._where} is closed")
        if self._gone is not None:
            raise DistStoreError(self._gone)
        with self._pool_lock:
            if os.getpid() != self._pid:
                # Forked child: the parent's sockets are not ours to use (or close).
                self._pid, self._pool = os.getpid(), []
                self._server = None
            for conn in self._pool:
                if conn.lock.acquire(blocking=False):
                    return conn
        # The server was up when this store connected: a new connection that cannot
        # be made within a few seconds means it is gone, not that it is starting.
        try:
            conn = self._open(time.monotonic() + min(_RECONNECT, self.timeout.total_seconds()))
        except (DistNetworkError, DistTimeoutError) as err:
            self._gone = f"{self._where} is gone: cannot reconnect ({err})"
            raise DistStoreError(self._gone) from None
        conn.lock.acquire()
        try:
            self._request(conn, Op.HELLO, [_ident().encode(), b"0"])  # named, not counted as a worker
        except BaseException:
            conn.lock.release()
            raise
        with self._pool_lock:
            self._pool.append(conn)
        return conn

    def _drop(self, conn: _Conn) -> None:
        with self._pool_lock:
            if conn in self._pool:
                self._pool.remove(conn)
        try:
            conn.sock.close()
        except OSError:
            pass

    def _request(self, conn: _Conn, op: Op, args: list[bytes], wait_s: float = 0.0) -> tuple[int, list[bytes]]:
        conn.sock.settimeout(max(wait_s, self.timeout.total_seconds()) + _MARGIN)
        try:
            send_frame(conn.sock, op, args)
            return recv_frame(conn.sock)
        except (socket.timeout, TimeoutError):
            self._drop(conn)
            raise DistTimeoutError(f"{self._where} did not answer {op.name} within {wait_s + _MARGIN:g} s") from None
        except (FrameError, OSError) as err:
            self._drop(conn)
            self._gone = f"{self._where} closed the connection during {op.name} ({err})"
            raise DistStoreError(self._gone) from None

    def _call(self, op: Op, args: list[bytes], wait_s: float = 0.0) -> list[bytes]:
        conn = self._acquire()
        try:
            status, reply = self._request(conn, op, args, wait_s)
        finally:
            conn.lock.release()
        if status == Status.OK:
            return reply
        if status == Status.TIMEOUT:
            missing = [k.decode() for k in reply]
            raise DistTimeoutError(f"store wait timed out after {wait_s:g} s; missing keys: {missing} ({self._where})")
        raise DistStoreError(f"{self._where}: {b''.join(reply).decode(errors='replace')}")

    def _timeout_ms(self, timeout) -> tuple[float, bytes]:
        seconds = max(0.0, as_timedelta(timeout, self.timeout).total_seconds())
        return seconds, str(int(seconds * 1000)).encode()

    def _wait_workers(self, world_size: int) -> None:
        seconds, ms = self._timeout_ms(None)
        try:
            self._call(Op.WAIT_WORKERS, [ms, str(world_size).encode()], seconds)
        except DistTimeoutError:
            joined = self._server.num_workers if self._server else "?"
            raise DistTimeoutError(
                f"TCPStore on {self.host}:{self.port}: only {joined} of {world_size} workers connected "
                f"within {seconds:g} s"
            ) from None

    # ------------------------------------------------------------ Store API
    def set(self, key, value):
        self._call(Op.SET, [check_key(key).encode(), as_bytes(value)])

    def get(self, key):
        seconds, ms = self._timeout_ms(None)
        return self._call(Op.GET, [ms, check_key(key).encode()], seconds)[0]

    def add(self, key, amount):
        check_key(key)
        if not isinstance(amount, int) or isinstance(amount, bool):
            raise TypeError(f"amount: expected int, got {type(amount).__name__}")
        return int(self._call(Op.ADD, [key.encode(), str(amount).encode()])[0])

    def compare_set(self, key, expected, desired):
        check_key(key)
        return self._call(Op.COMPARE_SET, [key.encode(), as_bytes(expected, "expected"), as_bytes(desired, "desired")])[0]

    def wait(self, keys: Sequence[str], timeout=None):
        keys = _key_list(keys)
        seconds, ms = self._timeout_ms(timeout)
        self._call(Op.WAIT, [ms, *(k.encode() for k in keys)], seconds)

    def check(self, keys):
        return self._call(Op.CHECK, [k.encode() for k in _key_list(keys)]) == [b"1"]

    def delete_key(self, key):
        return self._call(Op.DELETE, [check_key(key).encode()]) == [b"1"]

    def num_keys(self):
        return int(self._call(Op.NUM_KEYS, [])[0])

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        keys = _key_list(keys)
        seconds, ms = self._timeout_ms(None)
        return self._call(Op.MULTI_GET, [ms, *(k.encode() for k in keys)], seconds)

    def multi_set(self, keys: Sequence[str], values: Iterable[bytes | str]) -> None:
        keys, values = _key_list(keys), list(values)
        if len(keys) != len(values):
            raise ValueError(f"values: expected {len(keys)} values for {len(keys)} keys, got {len(values)}")
        args: list[bytes] = []
        for k, v in zip(keys, values):
            args += [k.encode(), as_bytes(v)]
        self._call(Op.MULTI_SET, args)

    def append(self, key, value):
        self._call(Op.APPEND, [check_key(key).encode(), as_bytes(value)])

    def ping(self) -> None:
        """Round trip to the server (raises if it is gone)."""
        self._call(Op.PING, [])

    def shutdown(self, grace: float = 0.0) -> None:
        """Close this client; on the master first wait up to ``grace`` seconds for
        the other clients to disconnect (they are done with the store), then stop
        the server. A dead client's connections are closed by its OS, so a peer
        that died does not hold this up."""
        server = self._server if os.getpid() == self._pid else None
        self._server = None
        self.close()
        if server is not None:
            if grace > 0 and not server.wait_idle(grace, ignore=_ident()):
                log.info("store server %s:%d: clients %s still connected after %g s; closing it anyway",
                         self.host, self.port, server.connected_clients(), grace)
            server.close()

    def close(self) -> None:
        """Close this client's connections; on the master also stop the server."""
        if self._closed:
            return
        self._closed = True
        with self._pool_lock:
            pool, self._pool = self._pool, []
            mine = os.getpid() == self._pid
        if mine:
            for conn in pool:
                try:
                    conn.sock.close()
                except OSError:
                    pass
            if self._server is not None:
                self._server.close()

    def __del__(self):
        try:
            if not self._closed and os.getpid() == self._pid:
                self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass


def _ident() -> str:
    """How the server names this process's connections."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _keepalive(sock: socket.socket) -> None:
    """A store host that vanishes without closing (power off, partition) is noticed
    within about a minute even while this client sits in a long server-side wait."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, opt):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
            except OSError:
                pass


def _key_list(keys) -> list[str]:
    if isinstance(keys, str):
        raise TypeError(f"keys: expected a list of str, got str {keys!r}")
    return [check_key(k) for k in keys]

