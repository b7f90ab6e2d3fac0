"""A process's goodbye never holds its exit on the store. Found in CI: the MPI suite at
``mpiexec -n 3`` hung once in about 40 runs after every test had passed. Rank 0 (the store's
host) and rank 1 were in ``MPI_Finalize``, alive and waiting for rank 2; rank 2 was in its
``atexit`` goodbye, writing ``bye/2`` to the store, which rank 0 no longer served. The
write waited out the store's timeout (30 min). Two faults, each tested here:

* **the store write was unbounded**: ``close`` now waits ``_BYE_STORE_S`` at most for it;
* **it was written when no peer needed it**: only a peer whose watch connection was never
  made reads a goodbye from the store. Rank 2 counted a peer that had just said goodbye (its
  connection gone, its loss not yet told) as one never connected.

The store's host is a real process, stopped with SIGSTOP: alive, its connections open, and
not answering, as a rank in ``MPI_Finalize`` is. The peers are real processes and watches
over real sockets."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from ndist.runtime import DistTimeoutError
from ndist.runtime._watch import _BYE_STORE_S, MemberWatch
from ndist.runtime.store import PrefixStore, TCPStore

_SECRET = os.urandom(16)

# The store's host: serves until its stdin closes.
_SERVER = textwrap.dedent("""
    import os, sys
    from ndist.runtime.store import TCPStore
    secret = bytes.fromhex(os.environ["TEST_WATCH_SECRET"])
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, secret=secret, timeout=30)
    print(server.port, flush=True)
    sys.stdin.read()
""")

# Rank 0 of a job of 2: publishes its watch, then stops before starting it ("stop": its
# listener takes rank 1's dial into its backlog and never answers), or starts it and waits
# ("watch").
_MEMBER = textwrap.dedent("""
    import os, signal, sys
    from ndist.runtime._watch import MemberWatch
    from ndist.runtime.store import PrefixStore, TCPStore
    port, then = int(sys.argv[1]), sys.argv[2]
    secret = bytes.fromhex(os.environ["TEST_WATCH_SECRET"])
    store = PrefixStore("watch", TCPStore("127.0.0.1", port, secret=secret, timeout=30))
    watch = MemberWatch(store, 0, 2, secret, 30.0, lambda *a: None)
    watch.publish()
    store.set("published/0", "1")
    if then == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    watch.start()
    sys.stdin.read()
""")


def _spawn(script: str, *args: str) -> subprocess.Popen:
    env = dict(os.environ, TEST_WATCH_SECRET=_SECRET.hex())
    return subprocess.Popen([sys.executable, "-c", script, *args], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def _state(proc: subprocess.Popen) -> str:
    with open(f"/proc/{proc.pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _await_stopped(proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while _state(proc) != "T":
        assert time.monotonic() < deadline, "the process did not stop"
        time.sleep(0.01)


def _close_within(watch: MemberWatch, seconds: float) -> float:
    """Close ``watch`` on a thread; the seconds it took (it must end within ``seconds``)."""
    t0 = time.monotonic()
    closer = threading.Thread(target=watch.close, daemon=True)
    closer.start()
    closer.join(seconds)
    assert not closer.is_alive(), f"close did not return within {seconds} s: it waits on the stopped store"
    return time.monotonic() - t0


def _finish(proc: subprocess.Popen) -> None:
    proc.kill()  # (SIGKILL ends a stopped process too)
    proc.wait(30)
    proc.stdout.close()
    proc.stdin.close()


@pytest.fixture
def server():
    proc = _spawn(_SERVER)
    try:
        yield proc, int(proc.stdout.readline())
    finally:
        _finish(proc)


@contextlib.contextmanager
def _job(port: int, then: str):
    """A job of 2 on the store at ``port``: rank 0 a process running ``_MEMBER`` with
    ``then``, rank 1 a watch here, published and started. Yields (store, member, watch)."""
    store = PrefixStore("watch", TCPStore("127.0.0.1", port, secret=_SECRET, timeout=30))
    member = _spawn(_MEMBER, str(port), then)
    watch = None
    try:
        store.wait(["published/0"], 30)
        if then == "stop":
            _await_stopped(member)
        watch = MemberWatch(store, 1, 2, _SECRET, 30.0, lambda *a: None)
        watch.publish()
        watch.start()
        yield store, member, watch
    finally:
        if watch is not None:
            watch.close()
        _finish(member)
        store.close()


@pytest.mark.timeout(90)
def test_a_goodbye_for_a_peer_never_connected_does_not_wait_on_a_stopped_store(server):
    proc, port = server
    # rank 0 is stopped before it starts its watch: rank 1's dial waits on a handshake that never comes
    with _job(port, "stop") as (store, _member, watch):
        os.kill(proc.pid, signal.SIGSTOP)
        _await_stopped(proc)
        took = _close_within(watch, 20.0)
        assert took < _BYE_STORE_S + 3.0, took
        os.kill(proc.pid, signal.SIGCONT)
        store.wait(["bye/1"], 30)  # the write was left behind, not dropped: it lands once the store answers


@pytest.mark.timeout(90)
def test_a_rank_whose_peers_all_connected_writes_no_goodbye_to_the_store(server):
    proc, port = server
    with _job(port, "watch") as (store, member, watch):
        deadline = time.monotonic() + 30
        while watch.tell({"hello": 1}) != [0]:  # (sent once the connection to rank 0 is made)
            assert time.monotonic() < deadline, "the watch never connected to rank 0"
            time.sleep(0.01)
        # rank 0 dies with the store stopped: rank 1's watch thread finds the connection gone
        # and waits on the store for a goodbye (its loss not told yet) while rank 1 closes
        os.kill(proc.pid, signal.SIGSTOP)
        _await_stopped(proc)
        member.kill()
        member.wait(30)
        deadline = time.monotonic() + 30
        while True:  # until the watch thread has dropped the connection (then it waits on the store)
            with watch._lock:
                if 0 not in watch._socks:
                    break
            assert time.monotonic() < deadline, "the watch never found rank 0's connection gone"
            time.sleep(0.01)
        assert not watch.lost  # (its loss is not told yet: the store does not answer)
        _close_within(watch, 20.0)
        os.kill(proc.pid, signal.SIGCONT)
        with pytest.raises(DistTimeoutError):
            store.wait(["bye/1"], 3)  # rank 0 had connected: nobody needs it
