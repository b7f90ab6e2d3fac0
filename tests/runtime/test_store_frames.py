"""The store server's memory grows with the bytes that arrive, not with the
lengths that clients announce (issue 14, item 6)."""

import os
import socket
import struct
import subprocess
import sys
import time
import uuid

import pytest

from ndist.runtime._net import client_handshake
from ndist.runtime.store import TCPStore
from ndist.runtime.store._wire import MAX_FRAME, Op

pytestmark = pytest.mark.timeout(90)

_SERVER = """
import sys
from ndist.runtime.store import TCPStoreServer
server = TCPStoreServer("127.0.0.1", 0, sys.argv[1])
print(server.port, flush=True)
sys.stdin.read()  # serve until the test closes our stdin
server.close()
"""


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_announced_frame_lengths_allocate_nothing_until_bytes_arrive():
    secret = uuid.uuid4().hex
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, secret], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    socks = []
    try:
        port = int(proc.stdout.readline())
        store = TCPStore("127.0.0.1", port, timeout=30, secret=secret)
        store.set("warm", b"x" * 4096)  # the server's client path is loaded before the baseline
        time.sleep(0.2)
        before = _rss_mib(proc.pid)
        for _ in range(4):  # four authenticated clients, each announcing a 1 GiB frame
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            client_handshake(s, secret.encode(), timeout=10)
            s.sendall(struct.pack("!I", MAX_FRAME) + bytes((Op.SET,)) + b"\0" * 1000)
            socks.append(s)
        time.sleep(1.0)
        grown = _rss_mib(proc.pid) - before
        assert grown < 64, f"the store server grew by {grown:.0f} MiB for 4 KiB received"
        # still serving, values of several MiB arrive whole
        big = os.urandom(5 << 20)
        store.set("big", big)
        assert store.get("big") == big
        store.close()
    finally:
        for s in socks:
            s.close()
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_frame_cut_short_drops_only_that_client():
    secret = uuid.uuid4().hex
    from ndist.runtime.store import TCPStoreServer

    with TCPStoreServer("127.0.0.1", 0, secret) as server:
        s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        client_handshake(s, secret.encode(), timeout=10)
        s.sendall(struct.pack("!I", 3 << 20) + bytes((Op.SET,)) + b"\0" * (2 << 20))
        s.close()  # 2 of 3 MiB, then gone
        store = TCPStore("127.0.0.1", server.port, timeout=10, secret=secret)
        store.set("k", b"v")
        assert store.get("k") == b"v"
        store.close()
