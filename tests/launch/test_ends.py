"""The agent's notices of its ranks' ends (ndist/launch/_ends.py): verdicts from a real store
server, and an agent whose store does not answer (node 0 cut off) is held at most once."""

import socket
import time

import pytest

from ndist.launch._ends import EndNotices
from ndist.launch._workers import WorkerSpec
from ndist.runtime._ended import JOIN_NAMESPACE, job_namespace
from ndist.runtime.store import PrefixStore, TCPStore, TCPStoreServer

pytestmark = pytest.mark.timeout(60)

SECRET = "cd" * 32


def _spec(rank):
    return WorkerSpec(rank=rank, local_rank=rank, argv=("-",), env={})


def test_verdicts_from_the_store():
    server = TCPStoreServer("127.0.0.1", 0, SECRET)
    rank0 = TCPStore("127.0.0.1", server.port, timeout=10, secret=SECRET)
    ends = EndNotices(lambda: TCPStore("127.0.0.1", server.port, timeout=10, secret=SECRET), 0, "node7", 3)
    try:
        assert not ends.claimed_any(5)
        rank0.compare_set(f"{job_namespace(0, 0)}/{JOIN_NAMESPACE}/rank/0", "", "node7:1:ab")  # rank 0 joined
        ends.tell(_spec(0), 101, 0)
        ends.tell(_spec(1), 102, -9)
        assert ends.before_join(0, 5) is False and ends.before_join(1, 5) is True
        assert ends.claimed_any(5)
        assert ends.waited_for([1], 5) == []
        PrefixStore(JOIN_NAMESPACE, PrefixStore(job_namespace(0, 0), rank0)).set("waited/1", "0")
        assert ends.waited_for([1], 5) == [1]
        assert (ends.ends[1].pid, ends.ends[1].host, ends.ends[1].returncode) == (102, "node7", -9)
    finally:
        ends.close()
        rank0.close()
        server.close()


def test_a_store_that_does_not_answer_holds_the_agent_once():
    # a listener that never accepts: the connection is made (the backlog) and never answered,
    # as node 0's store behind a cut link
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    ends = EndNotices(lambda: TCPStore("127.0.0.1", silent.getsockname()[1], timeout=30, secret=SECRET), 0,
                      "node7", 4)
    try:
        ends.tell(_spec(2), 103, 1)
        t0 = time.monotonic()
        assert ends.before_join(2, 0.5) is None
        first = time.monotonic() - t0
        t0 = time.monotonic()
        assert ends.before_join(2, 0.5) is None and ends.claimed_any(0.5) is False
        assert ends.waited_for([2], 0.5) == []
        later = time.monotonic() - t0
        t0 = time.monotonic()
        ends.close()
        closing = time.monotonic() - t0
    finally:
        silent.close()
    assert 0.4 < first < 5, first
    assert later < 0.2 and closing < 0.2, (later, closing)
