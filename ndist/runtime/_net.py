"""Socket plumbing shared by the store, the socket backend and the launcher.

* ``recv_exact`` / ``recv_into_exact`` loop on short reads; ``send_all`` on
  short writes. A closed peer becomes ``ConnectionResetError`` (callers turn
  it into their own typed error naming the peer).
* ``connect`` retries with jittered back-off until one deadline.
* ``server_handshake`` / ``client_handshake``: mutual HMAC-SHA256
  challenge-response on the job secret, constant-time comparison, before any
  other byte is read from the peer.
* ``job_secret()``: the secret of this job (``NDIST_SECRET``).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import random
import socket
import time

from ._errors import DistNetworkError, DistTimeoutError

__all__ = [
    "recv_exact",
    "recv_into_exact",
    "send_all",
    "connect",
    "server_handshake",
    "client_handshake",
    "job_secret",
    "set_job_secret",
    "AuthenticationError",
    "SECRET_ENV",
]

log = logging.getLogger("ndist.runtime.net")

SECRET_ENV = "NDIST_SECRET"
_MAGIC = b"NDIST1\0\0"
_NONCE = 32
_MAC = 32
_warned_no_secret = False


class AuthenticationError(ConnectionError):
    """The peer did not prove knowledge of the job secret (or we could not)."""


_process_secret: bytes | None = None


def set_job_secret(secret: bytes | str | None) -> None:
    """Make ``secret`` this process's job secret (``None``: back to ``$NDIST_SECRET``).

    Used by a rendezvous that agreed on a secret without a launcher (the MPI
    rendezvous broadcasts one): library code never writes ``os.environ``, so
    the socket backend and later stores find it here.
    """
    global _process_secret
    _process_secret = secret.encode() if isinstance(secret, str) else secret


def job_secret(secret: bytes | str | None = None) -> bytes:
    """The job secret: ``secret`` if given, else the one a rendezvous set with
    ``set_job_secret``, else ``$NDIST_SECRET``.

    Without any, the handshake still runs with an empty key: framing is
    checked but nothing is authenticated, and a warning is logged once.
    ``ndistrun``, ``ndist.testing`` and MPI rendezvous always set one.
    """
    global _warned_no_secret
    if secret is None:
        secret = _process_secret if _process_secret is not None else os.environ.get(SECRET_ENV, "")
    if isinstance(secret, str):
        secret = secret.encode()
    if not secret and not _warned_no_secret:
        _warned_no_secret = True
        log.warning("%s is not set: store and data connections are not authenticated", SECRET_ENV)
    return secret


def recv_into_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` completely from ``sock``."""
    view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionResetError(f"connection closed by peer after {got} of {n} bytes")
        got += k


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    if n:
        recv_into_exact(sock, memoryview(buf))
    return bytes(buf)


def send_all(sock: socket.socket, *parts) -> None:
    """Send every buffer in ``parts`` (bytes / memoryview / array), looping on short writes."""
    views = [memoryview(p).cast("B") for p in parts if len(memoryview(p).cast("B"))]
    while views:
        sent = sock.sendmsg(views)
        while sent:
            if sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0


def connect(host: str, port: int, deadline: float, what: str = "peer", rank: int | None = None) -> socket.socket:
    """Connect to ``host:port``, retrying with jittered back-off until ``deadline`` (monotonic)."""
    delay = 0.01
    last: Exception | None = None
    # An ASCII name is passed as bytes: for a str, getaddrinfo imports the IDNA codec
    # (encodings.idna, stringprep, unicodedata: ~3 ms of every rank's start-up).
    addr = host.encode("ascii") if isinstance(host, str) and host.isascii() else host
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise DistTimeoutError(
                f"could not connect to {what} at {host}:{port} before the deadline: {last}"
            ) if last is None or isinstance(last, (TimeoutError, socket.timeout)) else DistNetworkError(
                f"could not connect to {what} at {host}:{port}: {last}", rank=rank, host=host
            )
        try:
            sock = socket.create_connection((addr, port), timeout=min(left, 10.0))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as err:
            last = err
        time.sleep(min(delay * (0.5 + random.random()), max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 1.0)


def _mac(secret: bytes, label: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(secret, label + a + b, hashlib.sha256).digest()


def server_handshake(sock: socket.socket, secret: bytes, timeout: float = 10.0) -> None:
    """Authenticate a client that just connected. Raises ``AuthenticationError``."""
    old = sock.gettimeout()
    sock.settimeout(timeout)
    try:
        nonce_s = os.urandom(_NONCE)
        send_all(sock, _MAGIC, nonce_s)
        reply = recv_exact(sock, len(_MAGIC) + _NONCE + _MAC)
        if reply[: len(_MAGIC)] != _MAGIC:
            raise AuthenticationError("peer is not an ndist client (bad magic)")
        nonce_c = reply[len(_MAGIC) : len(_MAGIC) + _NONCE]
        if not hmac.compare_digest(reply[-_MAC:], _mac(secret, b"client", nonce_s, nonce_c)):
            send_all(sock, b"\0" * _MAC)
            raise AuthenticationError("client failed the job-secret challenge (NDIST_SECRET differs)")
        send_all(sock, _mac(secret, b"server", nonce_c, nonce_s))
    except (OSError, socket.timeout) as err:
        if isinstance(err, AuthenticationError):
            raise
        raise AuthenticationError(f"handshake failed: {err}") from err
    finally:
        sock.settimeout(old)


def client_handshake(sock: socket.socket, secret: bytes, timeout: float = 10.0, what: str = "server") -> None:
    """Prove the job secret to a server and check its proof. Raises ``AuthenticationError``."""
    old = sock.gettimeout()
    sock.settimeout(timeout)
    try:
        hello = recv_exact(sock, len(_MAGIC) + _NONCE)
        if hello[: len(_MAGIC)] != _MAGIC:
            raise AuthenticationError(f"{what} is not an ndist server (bad magic)")
        nonce_s = hello[len(_MAGIC) :]
        nonce_c = os.urandom(_NONCE)
        send_all(sock, _MAGIC, nonce_c, _mac(secret, b"client", nonce_s, nonce_c))
        proof = recv_exact(sock, _MAC)
        if not hmac.compare_digest(proof, _mac(secret, b"server", nonce_c, nonce_s)):
            raise AuthenticationError(
                f"{what} refused the job secret: this process's NDIST_SECRET does not match the job's"
            )
    except AuthenticationError:
        raise
    except (OSError, socket.timeout) as err:
        raise AuthenticationError(f"handshake with {what} failed: {err}") from err
    finally:
        sock.settimeout(old)
