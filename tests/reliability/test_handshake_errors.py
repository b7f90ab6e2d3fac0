"""A failed handshake is a DistError naming the peer (issue 14, item 3): a peer
that dies while a lazy connection to it is being opened is a DistNetworkError
with its rank; a wrong secret is a DistAuthenticationError saying so."""

import json
import logging
import socket
import struct
import threading
import time

import pytest

import ndist.distributed as dist
from ndist.collectives.backends.socket.wire._tcp import Mesh
from ndist.runtime import DistAuthenticationError, DistError, DistNetworkError
from ndist.runtime import _net
from ndist.runtime.store import HashStore

pytestmark = pytest.mark.timeout(60)


class _Resetter:
    """A real listener that accepts and resets each connection (a rank dying under it)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()  # RST: the client reads "[Errno 104] Connection reset by peer"

    def close(self) -> None:
        self.sock.close()


def _mesh(store, rank, secret):
    return Mesh(store, rank, 4, "g", secret, 10.0, {"transport": "tcp"})


def test_a_peer_reset_during_the_handshake_is_a_network_error_naming_it():
    store = HashStore()
    dying = _Resetter()
    store.set("sock/peer/3", json.dumps({"host": "127.0.0.1", "port": dying.port, "hostid": "elsewhere",
                                         "hostname": "node7", "token": "00" * 16, "unix": None}))
    mesh = _mesh(store, 0, b"s3cret")
    try:
        with pytest.raises(DistError) as info:
            mesh.p2p_socket(3, time.monotonic() + 5)
    finally:
        mesh.close()
        dying.close()
    err = info.value
    assert isinstance(err, DistNetworkError) and not isinstance(err, DistAuthenticationError), repr(err)
    assert err.rank == 3 and err.host == "node7", (err.rank, err.host)
    assert "rank 3" in str(err) and "handshake" in str(err), str(err)


def test_a_wrong_secret_is_a_dist_error_saying_the_secret_did_not_match(caplog):
    store = HashStore()
    theirs = _mesh(store, 1, b"the job's secret")
    ours = _mesh(store, 0, b"another secret")
    try:
        with caplog.at_level(logging.WARNING, logger="ndist"):
            with pytest.raises(DistAuthenticationError) as info:
                ours.p2p_socket(1, time.monotonic() + 5)
            deadline = time.monotonic() + 5
            while not any("rejected" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
                time.sleep(0.02)
    finally:
        ours.close()
        theirs.close()
    err = info.value
    assert isinstance(err, DistNetworkError) and isinstance(err, DistError)
    assert err.rank == 1, err.rank
    assert "rank 1" in str(err) and "secret did not match" in str(err), str(err)
    rejected = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert rejected and "secret did not match" in rejected[0], rejected


def test_the_error_is_public_and_pickles_with_its_peer():
    import pickle

    assert dist.DistAuthenticationError is DistAuthenticationError
    assert _net.AuthenticationError is DistAuthenticationError  # the old name still works
    err = pickle.loads(pickle.dumps(DistAuthenticationError("x", rank=2, host="h")))
    assert type(err) is DistAuthenticationError and (err.rank, err.host) == (2, "h")


def test_a_wait_for_a_peers_dial_fails_at_once_when_the_channel_is_abandoned():
    """A rank waiting for a peer's collective dial (its own was refused, or the peer's is
    being taken in) while a loss is recorded: the dial it waits for may be the very link
    ``abandon`` just told and closed, so it must fail at once naming the lost rank, not
    wait out the group timeout (kill trial seed 6181: 10 s, naming no one)."""
    store = HashStore()
    mesh = _mesh(store, 0, b"s3cret")
    got = {}

    def wait():
        t0 = time.monotonic()
        try:
            mesh._await_collective(1, time.monotonic() + 20)
        except DistError as err:
            got["err"] = err
        got["s"] = time.monotonic() - t0

    waiter = threading.Thread(target=wait, daemon=True)
    try:
        waiter.start()
        time.sleep(0.3)
        mesh.abandon(b"", (2, "node9", "rank 1 (node9) reported: lost point-to-point connection to rank 2"))
        waiter.join(10)
    finally:
        mesh.close()
    assert not waiter.is_alive() and "err" in got, got
    err = got["err"]
    assert isinstance(err, DistNetworkError) and err.rank == 2 and err.host == "node9", repr(err)
    assert "rank 2 (node9) is lost" in str(err), str(err)
    assert got["s"] < 2.0, got
