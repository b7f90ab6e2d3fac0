"""A member that left (the member watch told the group: ``member_departed``) fails a wait
for its dial at once, naming it and the host the watch told, also where this rank never
read the member's address (it waits for the member's dial, and has not dialled it). That
wait named the host "?" before: "cannot connect to rank 0 (?)", seen in the torch shrink
path. Real backends (threads of this process, real sockets, a real in-process store)."""

from __future__ import annotations

import time

import pytest

from ndist.runtime import DistNetworkError

from _socket_threads import make_backends

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
