"""The launcher's mark of a rank that ended before it joined (ndist/runtime/_ended.py), on a
real store server: a join waiting for it raises ``DistRankFailureError`` naming it at once, even
while another rank has not come yet (the join looks between slices of its wait), and the mark
tells the launcher whether the rank had joined. ndistrun's use of it: tests/launch/test_loss_before_join.py."""

import threading
import time
from datetime import timedelta

import pytest

from ndist.runtime import DistRankFailureError
from ndist.runtime._ended import JOIN_NAMESPACE, claimed_any, job_namespace, mark_ended, waited_for
from ndist.runtime._rendezvous import join
from ndist.runtime.store import PrefixStore, TCPStore, TCPStoreServer

pytestmark = pytest.mark.timeout(60)

SECRET = "ab" * 32


@pytest.fixture
def server():
    s = TCPStoreServer("127.0.0.1", 0, SECRET)
    yield s
    s.close()


def _client(server):
    return TCPStore("127.0.0.1", server.port, timeout=30, secret=SECRET)


def _join_in_thread(server, rank, world, box):
    def run():
        store = _client(server)
        try:
            join(PrefixStore(JOIN_NAMESPACE, PrefixStore(job_namespace(0, 0), store)), rank, world,
                 timedelta(seconds=30))
            box[rank] = ("joined", time.monotonic())
        except Exception as err:  # noqa: BLE001 - the test looks at it
            box[rank] = (err, time.monotonic())
        finally:
            store.close()

    t = threading.Thread(target=run)
    t.start()
    return t


def test_a_join_names_a_marked_rank_while_another_has_not_come(server):
    # ranks 0 and 1 of 4 wait; rank 3 never comes; rank 2 is marked (killed) by the launcher
    box: dict = {}
    threads = [_join_in_thread(server, r, 4, box) for r in (0, 1)]
    launcher = _client(server)
    try:
        while not claimed_any(launcher, 0, 4):
            time.sleep(0.01)
        time.sleep(0.3)  # both wait (a slice of their wait has passed)
        assert box == {}
        marked = time.monotonic()
        assert mark_ended(launcher, 0, 2, host="node7", pid=4242, returncode=-9, how="killed by SIGKILL") is True
        for t in threads:
            t.join(20)
        for r in (0, 1):
            err, at = box[r]
            assert isinstance(err, DistRankFailureError), err
            assert (err.failed_ranks, err.hosts, err.causes, err.rank, err.host) == ([2], ["node7"], ["died"], 2, "node7")
            assert str(err) == (f"init_process_group on rank {r}: rank 2 (node7) died before it joined the group "
                                "(killed by SIGKILL, seen by the launcher). The group of 4 ranks cannot be made "
                                "without it")
            assert at - marked < 5, at - marked  # (0.25 s slices; generous for a loaded machine)
        assert waited_for(launcher, 0, [2, 3]) == [2]
    finally:
        launcher.close()


def test_marks_of_several_ranks_name_a_death_first(server):
    launcher = _client(server)
    try:
        assert mark_ended(launcher, 0, 3, host="a", pid=1, returncode=0, how="exit code 0")
        assert mark_ended(launcher, 0, 1, host="b", pid=2, returncode=-9, how="killed by SIGKILL")
        box: dict = {}
        _join_in_thread(server, 0, 4, box).join(20)  # rank 2 never comes: the marks are there first
        err = box[0][0]
        assert isinstance(err, DistRankFailureError), err
        assert (err.failed_ranks, err.hosts, err.causes, err.rank) == ([1, 3], ["b", "a"], ["died", "exited"], 1)
        assert "rank 1 (b) died before it joined the group (killed by SIGKILL" in str(err)
        assert "rank 3 (a) exited before it joined the group (exit code 0" in str(err)
        assert str(err).endswith("cannot be made without them")
    finally:
        launcher.close()


def test_a_rank_that_joined_keeps_its_claim(server):
    # a world of 2 joins; then both end: the marks do not land, and a mark of a rank outside
    # the world (an explicit smaller world_size) does not fail a join
    box: dict = {}
    launcher = _client(server)
    try:
        assert mark_ended(launcher, 0, 5, host="c", pid=3, returncode=0, how="exit code 0")
        for t in [_join_in_thread(server, r, 2, box) for r in (0, 1)]:
            t.join(20)
        assert [box[r][0] for r in (0, 1)] == ["joined", "joined"]
        assert claimed_any(launcher, 0, 2)
        assert mark_ended(launcher, 0, 0, host="c", pid=3, returncode=0, how="exit code 0") is False
        assert mark_ended(launcher, 0, 1, host="c", pid=4, returncode=-9, how="killed by SIGKILL") is False
        assert waited_for(launcher, 0, [0, 1, 5]) == []
        # another attempt (restart count 1) is another namespace: nothing of attempt 0 is seen there
        assert not claimed_any(launcher, 1, 2)
    finally:
        launcher.close()
