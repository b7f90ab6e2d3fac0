"""A member that left (the member watch told the group: ``member_departed``) fails a wait
for its dial at once, naming it and the host the watch told, also where this rank never
read the member's address (it waits for the member's dial, and has not dialled it). That
wait named the host "?" before: "cannot connect to rank 0 (?)", seen in the torch shrink
path. Real backends (threads of this process, real sockets, a real in-process store)."""

from __future__ import annotations

import time

import pytest

from ndist.runtime import DistNetworkError

from tests.collectives.backends._socket_threads import make_backends

pytestmark = pytest.mark.timeout(60)


def test_a_wait_for_a_departed_members_dial_names_it_and_its_host():
    backends = make_backends(2, timeout=30.0)
    try:
        be = backends[0].backend
        be.member_departed(1, "hostX", "it exited (its interpreter ended)")
        t0 = time.monotonic()
        with pytest.raises(DistNetworkError) as ei:
            be._mesh._await_collective(1, time.monotonic() + 20)
        assert time.monotonic() - t0 < 10  # at once, not at the deadline
        err = ei.value
        assert err.rank == 1 and err.host == "hostX", (err.rank, err.host, str(err))
        assert "cannot connect to rank 1 (hostX): it exited (its interpreter ended)" in str(err), str(err)
    finally:
        for b in backends:
            b.close()


def test_a_wait_for_a_dial_fails_at_once_when_the_group_is_revoked():
    """``ProcessGroup.revoke_for`` (a member began ``shrink_group`` on the default group)
    reaches the backend as ``group_revoked`` for a process outside the group: a wait for
    a live member's dial that is already waiting wakes and fails, naming that process."""
    import threading

    backends = make_backends(2, timeout=30.0)
    try:
        be = backends[0].backend
        caught: list = []

        def wait():
            try:
                be._mesh._await_collective(1, time.monotonic() + 20)
            except BaseException as err:  # noqa: BLE001 - what the test checks
                caught.append(err)

        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        time.sleep(0.3)  # (the waiter is in its wait: rank 1 is alive and never dials)
        assert waiter.is_alive() and not caught
        t0 = time.monotonic()
        be.group_revoked(5, "hostZ", "a member aborted the group for it")
        waiter.join(10)
        assert not waiter.is_alive() and time.monotonic() - t0 < 5  # at once, not at the deadline
        (err,) = caught
        assert isinstance(err, DistNetworkError), repr(err)
        assert err.rank == 5 and err.host == "hostZ", (err.rank, err.host, str(err))
        assert "rank 5 (hostZ) is lost" in str(err), str(err)
    finally:
        for b in backends:
            b.close()
