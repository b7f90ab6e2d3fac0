"""Taking in the connections of a backend's listeners: accept, authenticate, hand over.

One thread per backend serves every listener (TCP and the abstract Unix socket)
with a ``selectors`` loop. Each connection it accepts goes through the job-secret
handshake (``_net.ServerChallenge``) and the hello naming channel, rank and the
listener's instance token as a small non-blocking state machine, so any number of
handshakes proceed at once: a client that is slow, silent, or trickles one byte a
second delays no one else, and is dropped when its handshake has not completed
within ``HANDSHAKE_S`` seconds in all. A connection that completes is made
blocking again and passed to ``on_ready(sock, addr, channel, rank)`` in order of
completion.
"""

from __future__ import annotations

import logging
import selectors
import socket
import struct
import threading
import time

from .....runtime import _net

__all__ = ["Acceptor", "HELLO", "HELLO_MAGIC", "HANDSHAKE_S"]

log = logging.getLogger("ndist.collectives.socket")

HELLO = struct.Struct("<4sBII16s")
HELLO_MAGIC = b"NDH1"
#: seconds a connection has to complete the handshake and hello, in all
HANDSHAKE_S = 10.0
#: connections in handshake at once; beyond that the oldest is dropped (an honest
#: peer completes within a round trip, so the oldest is the likeliest stranger)
MAX_PENDING = 1024


class _Pending:
    __slots__ = ("sock", "addr", "deadline", "challenge", "need", "buf", "stage")

    def __init__(self, sock, addr, deadline, challenge) -> None:
        self.sock = sock
        self.addr = addr
        self.deadline = deadline
        self.challenge = challenge
        self.need = _net.ServerChallenge.REPLY
        self.buf = bytearray()
        self.stage = "reply"


class _Rejected(Exception):
    pass


class Acceptor:
    """Serves ``listeners`` on one daemon thread until ``close()``.

    ``check_hello(channel, rank, size, token) -> str | None`` returns why a hello is
    refused (None: accepted); ``on_ready(sock, addr, channel, rank)`` takes a
    connection that passed both the handshake and the hello.
    """

    def __init__(self, listeners, secret: bytes, check_hello, on_ready, name: str) -> None:
        self._secret = secret
        self._check_hello = check_hello
        self._on_ready = on_ready
        self._closed = False
        self._sel = selectors.DefaultSelector()
        self._pending: dict[int, _Pending] = {}  # fd -> state, in order of arrival
        self._listeners = [lst for lst in listeners if lst is not None]
        for lst in self._listeners:
            lst.setblocking(False)
            self._sel.register(lst, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed = True
        for lst in self._listeners:
            try:
                lst.shutdown(socket.SHUT_RDWR)  # wakes the selector: the listener turns readable
            except OSError:
                pass
        self._thread.join(timeout=2.0)

    # ------------------------------------------------------------ the loop
    def _run(self) -> None:
        try:
            while not self._closed:
                timeout = 0.5
                if self._pending:
                    first = min(p.deadline for p in self._pending.values())
                    timeout = max(0.0, min(timeout, first - time.monotonic()))
                for key, _ in self._sel.select(timeout):
                    if self._closed:
                        break
                    if key.data is None:
                        self._accept(key.fileobj)
                    else:
                        self._advance(key.data)
                self._expire()
        finally:
            for p in list(self._pending.values()):
                self._drop(p)
            self._sel.close()

    def _accept(self, listener) -> None:
        for _ in range(64):  # take in what is queued, a bounded batch per wake-up
            try:
                sock, addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                if not self._closed:
                    log.debug("accept failed: %s", err)
                    time.sleep(0.01)  # e.g. EMFILE: do not spin
                return
            try:
                sock.setblocking(False)
                challenge = _net.ServerChallenge(self._secret)
                if sock.send(challenge.hello) != len(challenge.hello):
                    raise OSError("could not send the handshake")
            except OSError as err:
                log.debug("connection from %s failed at once: %s", addr, err)
                sock.close()
                continue
            if len(self._pending) >= MAX_PENDING:
                oldest = next(iter(self._pending.values()))
                log.warning("rejected connection from %s: more than %d handshakes at once", oldest.addr,
                            MAX_PENDING)
                self._drop(oldest)
            p = _Pending(sock, addr, time.monotonic() + HANDSHAKE_S, challenge)
            self._pending[sock.fileno()] = p
            self._sel.register(sock, selectors.EVENT_READ, p)

    def _advance(self, p: _Pending) -> None:
        try:
            try:
                chunk = p.sock.recv(p.need - len(p.buf))  # never past this stage: data may follow the hello
            except (BlockingIOError, InterruptedError):
                return
            if not chunk:
                raise _Rejected(f"closed by the client after {len(p.buf)} of {p.need} bytes ({p.stage})")
            p.buf += chunk
            if len(p.buf) < p.need:
                return
            if p.stage == "reply":
                out, refused = p.challenge.answer(bytes(p.buf), "client")
                if out:
                    p.sock.send(out)  # 32 bytes on a socket that has sent 40: the buffer has room
                if refused is not None:
                    raise _Rejected(str(refused))
                p.stage, p.need, p.buf = "hello", HELLO.size, bytearray()
                return
            magic, channel, rank, size, token = HELLO.unpack(bytes(p.buf))
            why = "bad hello magic" if magic != HELLO_MAGIC else self._check_hello(channel, rank, size, token)
            if why is not None:
                raise _Rejected(why)
        except (_Rejected, OSError) as err:
            log.warning("rejected connection from %s: %s", p.addr, err)
            self._drop(p)
            return
        self._forget(p)
        try:
            p.sock.setblocking(True)
            self._on_ready(p.sock, p.addr, channel, rank)
        except Exception as err:  # noqa: BLE001 - a bad connection must not kill the listener
            log.warning("rejected connection from %s: %s", p.addr, err)
            p.sock.close()

    def _expire(self) -> None:
        now = time.monotonic()
        for p in [p for p in self._pending.values() if p.deadline <= now]:
            log.warning("rejected connection from %s: no complete handshake within %g s (%d of %d bytes of the "
                        "%s)", p.addr, HANDSHAKE_S, len(p.buf), p.need, p.stage)
            self._drop(p)

    def _forget(self, p: _Pending) -> None:
        self._pending.pop(p.sock.fileno(), None)
        try:
            self._sel.unregister(p.sock)
        except (KeyError, ValueError):
            pass

    def _drop(self, p: _Pending) -> None:
        self._forget(p)
        p.sock.close()
