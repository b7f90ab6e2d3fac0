"""The member watch names a member that died before it connected, whatever else the job's
other members are doing, within about a second. Found by the ``--on-failure continue`` kill
trials (tools/trials/kill_trials.py, seed 50060: n = 8, tcp, rank 5 killed before its first
op): ranks 0, 6 and 7 named rank 5 at once; ranks 1-4 never did, and waited out the group
timeout. Two ways a verdict was held back, each tested here with real processes:

* **a taken port**: a lower rank probes the listener of a higher one that has not dialled
  yet, and took "it accepted a connection" for "it is alive". Once the higher rank died, a
  new listener of the job (a group's data listener, made at the first collective) could bind
  its freed port, and every later probe "succeeded". Here a store server of the job binds
  the dead member's port;
* **a busy peer**: the watch thread dialled the lower ranks one at a time, with a 10 s
  handshake timeout, before it watched or probed anything; a lower rank too busy to answer
  (here: stopped with SIGSTOP before it started its watch) held back every verdict.

Each watch runs in a process of its own or in this test's process, over real sockets, with a
real store server; the dead member is a real process killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from ndist.runtime._errors import DIED
from ndist.runtime._watch import MemberWatch
from ndist.runtime.store import PrefixStore, TCPStore

_SECRET = os.urandom(16)

# A member: publishes its watch address, then dies (SIGKILL) or stops (SIGSTOP) before it
# starts its watch, as a process killed or descheduled between the rendezvous and its first op.
_MEMBER = textwrap.dedent("""
    import os, signal, sys
    from ndist.runtime._watch import MemberWatch
    from ndist.runtime.store import PrefixStore, TCPStore
    port, rank, size, then = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    secret = bytes.fromhex(os.environ["TEST_WATCH_SECRET"])
    store = PrefixStore("watch", TCPStore("127.0.0.1", port, secret=secret, timeout=30))
    watch = MemberWatch(store, rank, size, secret, 30.0, lambda *a: None)
    watch.publish()
    store.set(f"published/{rank}", "1")
    os.kill(os.getpid(), signal.SIGKILL if then == "die" else signal.SIGSTOP)
""")


class _Losses:
    """The ``on_loss`` calls of one watch, with when each came."""

    def __init__(self) -> None:
        self.got: dict[int, tuple[str, str, float]] = {}
        self.cond = threading.Condition()

    def __call__(self, rank: int, host: str, cause: str, detail: str) -> None:
        with self.cond:
            self.got[rank] = (cause, detail, time.monotonic())
            self.cond.notify_all()

    def wait_for(self, rank: int, timeout: float):
        with self.cond:
            self.cond.wait_for(lambda: rank in self.got, timeout)
            return self.got.get(rank)


def _member(port: int, rank: int, size: int, then: str) -> subprocess.Popen:
    env = dict(os.environ, TEST_WATCH_SECRET=_SECRET.hex())
    return subprocess.Popen([sys.executable, "-c", _MEMBER, str(port), str(rank), str(size), then], env=env)


def _await_published(store, rank: int, proc: subprocess.Popen) -> None:
    store.wait([f"published/{rank}"], 30)
    if proc.poll() is None and proc.args[-1] == "stop":
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # (stopped: its state is T)
            with open(f"/proc/{proc.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "T":
                    return
            time.sleep(0.01)
        raise AssertionError("the member did not stop")


def _start_watches(store, ranks, size: int, watches: list):
    """A watch for each of ``ranks`` (of ``size``), added to ``watches``, published, then
    started: their ``_Losses`` by rank, and when they started."""
    losses = {rank: _Losses() for rank in ranks}
    for rank in ranks:
        watches.append(MemberWatch(store, rank, size, _SECRET, 30.0, losses[rank]))
        watches[-1].publish()
    t0 = time.monotonic()
    for w in watches:
        w.start()
    return losses, t0


def _named_at_once(losses, t0: float, dead: int, why: str = "") -> None:
    """Every watch of ``losses`` named ``dead`` as died, within 2 s of ``t0``."""
    for rank, lost in losses.items():
        got = lost.wait_for(dead, 10.0)
        assert got is not None, f"rank {rank}'s watch never named rank {dead}{why}"
        cause, detail, at = got
        assert cause == DIED, (rank, got)
        assert at - t0 < 2.0, (rank, at - t0, detail)


@pytest.mark.timeout(60)
def test_a_dead_member_whose_port_another_listener_took_is_named():
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, secret=_SECRET, timeout=30)
    store = PrefixStore("watch", server)
    dead = _member(server.port, 2, 3, "die")
    watches, taker = [], None
    try:
        _await_published(store, 2, dead)
        assert dead.wait(30) == -signal.SIGKILL
        port = json.loads(store.get("addr/2"))["port"]
        # a listener of the job takes the dead member's port, speaking the job's handshake
        taker = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, secret=_SECRET, timeout=30)
        losses, t0 = _start_watches(store, (0, 1), 3, watches)
        _named_at_once(losses, t0, 2, " (its port answered for it)")
        for rank in (0, 1):
            assert 1 - rank not in losses[rank].got, (rank, losses[rank].got)  # the live one is not lost
    finally:
        for w in watches:
            w.close()
        if taker is not None:
            taker.close()
        if dead.poll() is None:
            dead.kill()
            dead.wait()
        server.close()


@pytest.mark.timeout(60)
def test_a_stopped_lower_rank_does_not_hold_back_the_verdict_on_a_dead_higher_one():
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, secret=_SECRET, timeout=30)
    store = PrefixStore("watch", server)
    stopped = _member(server.port, 1, 4, "stop")
    dead = _member(server.port, 3, 4, "die")
    watches = []
    try:
        _await_published(store, 1, stopped)
        _await_published(store, 3, dead)
        assert dead.wait(30) == -signal.SIGKILL
        # rank 2 dials ranks 0 and 1; rank 1 is stopped and never answers its handshake
        losses, t0 = _start_watches(store, (0, 2), 4, watches)
        _named_at_once(losses, t0, 3)
        for rank in (0, 2):
            assert 1 not in losses[rank].got, (rank, losses[rank].got)  # stopped is not lost
    finally:
        for w in watches:
            w.close()
        for p in (stopped, dead):
            if p.poll() is None:
                p.kill()
                p.wait()
        server.close()
