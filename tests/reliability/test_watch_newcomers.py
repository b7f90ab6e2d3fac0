"""The member watch of a heal (runtime/_watch.py, ``add_members`` / ``start(peers)``): a
newcomer whose hello reaches a member before that member added it (its grow decision is read
a moment later there) is held, not refused, and adopted by ``add_members``; from then on its
goodbye or its death is told like any member's. A newcomer added that never dials (it died
in the queue) is found by the member's probes. Real watches over real sockets, a real store
server, in this test's process (a newcomer is a watch with a job rank above the job's)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest

from ndist.runtime._errors import DIED, EXITED
from ndist.runtime._watch import MemberWatch
from ndist.runtime.store import PrefixStore, TCPStore

pytestmark = pytest.mark.timeout(60)

_SECRET = os.urandom(16)


class _Losses:
    def __init__(self) -> None:
        self.got: dict[int, tuple[str, str]] = {}
        self.cond = threading.Condition()

    def __call__(self, rank: int, host: str, cause: str, detail: str) -> None:
        with self.cond:
            self.got[rank] = (cause, detail)
            self.cond.notify_all()

    def wait_for(self, rank: int, timeout: float):
        with self.cond:
            self.cond.wait_for(lambda: rank in self.got, timeout)
            return self.got.get(rank)


def _store():
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, secret=_SECRET, timeout=30)
    return server, PrefixStore("watch", server)


def test_a_newcomer_that_dials_before_it_is_added_is_adopted_then_its_goodbye_is_told():
    server, store = _store()
    member_losses, newcomer_losses = _Losses(), _Losses()
    member = MemberWatch(store, 0, 1, _SECRET, 30.0, member_losses)
    newcomer = MemberWatch(store, -1, 1, _SECRET, 30.0, newcomer_losses)
    try:
        member.publish()
        member.start()
        newcomer.rank = 5  # (a job of 4 ranks at first: its first newcomer after one admitted)
        newcomer.start({0: json.loads(store.get("addr/0"))})  # it dials rank 0 at once
        deadline = time.monotonic() + 10
        while 5 not in member._early:  # the hello came before the member added it: held
            assert time.monotonic() < deadline, "the newcomer's hello never reached the member"
            time.sleep(0.01)
        time.sleep(0.3)
        assert newcomer_losses.got == {} and member_losses.got == {}  # nobody is told a loss for it
        member.add_members({5: newcomer.info})
        assert 5 not in member._early and 5 in member._socks
        newcomer.close(EXITED, "its interpreter ended")
        cause, detail = member_losses.wait_for(5, 10)
        assert (cause, detail) == (EXITED, "its interpreter ended")
    finally:
        newcomer.close()
        member.close()
        server.close()


def test_an_added_newcomer_that_never_dials_because_it_died_is_found_by_the_probes():
    server, store = _store()
    losses = _Losses()
    member = MemberWatch(store, 0, 1, _SECRET, 30.0, losses)
    try:
        member.publish()
        member.start()
        # a newcomer's listener address, closed: the process died in the queue
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        t0 = time.monotonic()
        member.add_members({4: {"host": "127.0.0.1", "port": port, "hostname": "gone", "token": os.urandom(16).hex(),
                                "pid": 0}})
        cause, detail = losses.wait_for(4, 10)
        assert cause == DIED and "refused" in detail, detail
        assert time.monotonic() - t0 < 2.0
    finally:
        member.close()
        server.close()
