"""Socket plumbing shared by the store, the socket backend and the launcher.

* ``recv_exact`` / ``recv_into_exact`` loop on short reads; ``send_all`` on
  short writes. A closed peer becomes ``ConnectionResetError`` (callers turn
  it into their own typed error naming the peer).
* ``connect`` retries with jittered back-off until one deadline.
* ``server_handshake`` / ``client_handshake``: mutual HMAC-SHA256
  challenge-response on the job secret, constant-time comparison, before any
  other byte is read from the peer, within one deadline for the whole exchange.
  A wrong secret raises ``DistAuthenticationError``; a connection that fails
  meanwhile ``DistNetworkError`` (both ``DistError``s naming the peer).
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

from ._errors import DistAuthenticationError, DistNetworkError, DistTimeoutError

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
    "ServerChallenge",
    "recv_exact_before",
    "SECRET_ENV",
    "host_identity",
    "machine_of",
    "pid_namespace",
    "listen_address",
    "is_loopback",
]

log = logging.getLogger("ndist.runtime.net")

SECRET_ENV = "NDIST_SECRET"
_MAGIC = b"NDIST1\0\0"
_NONCE = 32
_MAC = 32
_warned_no_secret = False


#: the name this module used (a ``ConnectionError`` then); now the ``DistError`` of a
#: wrong secret, so ``except dist.DistError`` sees every failed handshake
AuthenticationError = DistAuthenticationError


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


def recv_exact_before(sock: socket.socket, n: int, deadline: float) -> bytes:
    """``n`` bytes from a blocking ``sock`` before ``deadline`` (monotonic), however
    they trickle in; ``socket.timeout`` after it."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout(f"timed out: {got} of {n} bytes arrived before the deadline")
        sock.settimeout(left)
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionResetError(f"connection closed by peer after {got} of {n} bytes")
        got += k
    return bytes(buf)


class ServerChallenge:
    """The server's side of the handshake as data, for a caller that does its own I/O
    (the socket backend drives many handshakes from one thread): send ``hello``, read
    ``REPLY`` bytes, send what ``answer`` returns, then raise its error if there is one."""

    REPLY = len(_MAGIC) + _NONCE + _MAC

    def __init__(self, secret: bytes) -> None:
        self.secret = secret
        self.nonce = os.urandom(_NONCE)
        self.hello = _MAGIC + self.nonce

    def answer(self, reply: bytes, what: str = "client") -> tuple[bytes, DistAuthenticationError | None]:
        """``(bytes to send, error)``: the server's proof, or a refusal and the error."""
        if reply[: len(_MAGIC)] != _MAGIC:
            return b"", DistAuthenticationError(f"{what} is not an ndist client (bad magic)")
        nonce_c = reply[len(_MAGIC) : len(_MAGIC) + _NONCE]
        if not hmac.compare_digest(reply[-_MAC:], _mac(self.secret, b"client", self.nonce, nonce_c)):
            return b"\0" * _MAC, DistAuthenticationError(
                f"{what} failed the job-secret challenge: the secret did not match (its NDIST_SECRET differs "
                "from this job's)")
        return _mac(self.secret, b"server", nonce_c, self.nonce), None


def server_handshake(sock: socket.socket, secret: bytes, timeout: float = 10.0, what: str = "client") -> None:
    """Authenticate a client that just connected, within ``timeout`` seconds in all
    (a client trickling bytes cannot hold it longer). Raises ``DistAuthenticationError``
    (wrong secret, not ndist) or ``DistNetworkError`` (closed, reset, too slow)."""
    deadline = time.monotonic() + timeout
    old = sock.gettimeout()
    try:
        challenge = ServerChallenge(secret)
        sock.settimeout(max(0.001, timeout))
        send_all(sock, challenge.hello)
        out, refused = challenge.answer(recv_exact_before(sock, ServerChallenge.REPLY, deadline), what)
        if out:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            send_all(sock, out)
        if refused is not None:
            raise refused
    except DistNetworkError:
        raise
    except OSError as err:
        raise DistNetworkError(f"handshake with {what} failed: {err}") from err
    finally:
        try:
            sock.settimeout(old)
        except OSError:
            pass


def client_handshake(sock: socket.socket, secret: bytes, timeout: float = 10.0, what: str = "server",
                     rank: int | None = None, host: str | None = None) -> None:
    """Prove the job secret to a server and check its proof, within ``timeout`` seconds.

    Raises ``DistAuthenticationError`` when the secrets differ (or the server is not
    ndist) and ``DistNetworkError`` when the connection fails meanwhile (the peer died:
    reset, closed, timed out); both carry ``rank`` / ``host`` of the peer when given."""
    deadline = time.monotonic() + timeout
    old = sock.gettimeout()
    try:
        hello = recv_exact_before(sock, len(_MAGIC) + _NONCE, deadline)
        if hello[: len(_MAGIC)] != _MAGIC:
            raise DistAuthenticationError(f"{what} is not an ndist server (bad magic)", rank=rank, host=host)
        nonce_s = hello[len(_MAGIC) :]
        nonce_c = os.urandom(_NONCE)
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        send_all(sock, _MAGIC, nonce_c, _mac(secret, b"client", nonce_s, nonce_c))
        proof = recv_exact_before(sock, _MAC, deadline)
        if not hmac.compare_digest(proof, _mac(secret, b"server", nonce_c, nonce_s)):
            raise DistAuthenticationError(
                f"{what} refused the job secret: the secret did not match (this process's NDIST_SECRET "
                "differs from the job's)", rank=rank, host=host)
    except DistNetworkError:
        raise
    except OSError as err:
        raise DistNetworkError(f"handshake with {what} failed: {err}", rank=rank, host=host) from err
    finally:
        try:
            sock.settimeout(old)
        except OSError:
            pass


# ----------------------------------------------------------------- where a process listens
def host_identity() -> str:
    """hostname + boot id + network namespace: equal exactly when two processes share
    a kernel (so /dev/shm) and a loopback interface (so 127.0.0.1 reaches the peer).
    Ranks in different network namespaces of one machine (containers, ``ip netns``)
    count as different hosts."""
    boot = ""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        pass
    try:
        netns = os.readlink("/proc/self/ns/net")
    except OSError:
        netns = ""
    return f"{socket.gethostname()}/{boot}/{netns}"


def machine_of(hostid: str) -> str:
    """The kernel (boot id) of a ``host_identity``: equal for processes that share one machine's
    CPUs, network namespaces and containers of it included; the whole identity where the boot
    id could not be read."""
    parts = hostid.split("/")
    return parts[1] if len(parts) == 3 and parts[1] else hostid


def pid_namespace() -> str:
    """This process's pid namespace (two pids compare only within one)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _advertised_host() -> str:
    """The address peers on other hosts dial: ``NDIST_SOCKET_HOST`` if set, else the
    local address of the route to ``MASTER_ADDR`` (the interface the job uses),
    else the host name's address."""
    host = os.environ.get("NDIST_SOCKET_HOST")
    if host:
        return host
    master = os.environ.get("MASTER_ADDR")
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((master, int(os.environ.get("MASTER_PORT", "29500") or 29500)))
                return probe.getsockname()[0]
        except (OSError, ValueError):
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def is_loopback(host: str) -> bool:
    return host == "localhost" or host.startswith("127.") or host == "::1"


def _single_node() -> bool:
    """The launcher says every rank runs on this node (LOCAL_WORLD_SIZE == WORLD_SIZE)."""
    local, world = os.environ.get("LOCAL_WORLD_SIZE"), os.environ.get("WORLD_SIZE")
    return bool(local) and local == world and not os.environ.get("NDIST_SOCKET_HOST")


def listen_address() -> tuple[str, str]:
    """``(bind, advertised)``: a single-node job (or one whose peers are reached over
    loopback) listens on 127.0.0.1 only; otherwise on every interface, advertising
    the address of the route to the job's store."""
    if _single_node():
        return "127.0.0.1", "127.0.0.1"
    host = _advertised_host()
    return ("127.0.0.1" if is_loopback(host) else ""), host
