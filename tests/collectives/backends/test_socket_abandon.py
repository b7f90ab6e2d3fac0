"""``Mesh.abandon``: a group that lost a member gives every collective link a peer dialled
but its engine has not taken yet the lost notice, then ends its sending side, and keeps the
socket open until the group closes. Closing it at once, with bytes the peer sent still
unread, resets the connection, and the reset can reach the peer before the notice: the peer
then names this rank as lost, not the dead one, and a shrink excludes this live rank (kill
trial seed 3104, n = 8, tcp: ``this rank (3) ... is alive and called shrink_group, but the
other survivors excluded it``). The method that sends the notice had been dropped with the
full-mesh set-up (``80845d8``), so ``abandon`` raised ``AttributeError`` and the socket was
closed by the garbage collector."""

import pytest

from ndist.testing import run_ranks

NOTICE = b"the lost notice: rank 9 is lost"


def _job(rank, size):
    import time
    from datetime import timedelta

    from ndist.runtime import resolve_group

    mesh = resolve_group(None).backend_for("cpu")._mesh
    store = mesh.store
    wait = timedelta(seconds=30)
    if rank == 1:
        sock, _facts = mesh.collective_link(0, time.monotonic() + 30)  # rank 0's engine never takes it
        sock.sendall(b"x" * 4096)  # what rank 0 never reads
        store.set("test/sent", b"1")
        store.wait(["test/abandoned"], wait)
        got, sock_timeout = b"", time.monotonic() + 10
        sock.settimeout(10)
        try:
            while time.monotonic() < sock_timeout:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                got += chunk
        except ConnectionResetError:
            got += b"<reset>"
        store.set("test/read", b"1")
        return got
    store.wait(["test/sent"], wait)
    end = time.monotonic() + 30
    while 1 not in mesh._coll and time.monotonic() < end:  # (the acceptor's thread takes it in)
        time.sleep(0.01)
    mesh.abandon(NOTICE, (9, "h", "the test"))
    store.set("test/abandoned", b"1")
    store.wait(["test/read"], wait)
    return None


@pytest.mark.timeout(90)
def test_abandon_tells_a_dialled_link_the_lost_notice_and_does_not_reset_it():
    res = run_ranks(_job, 2, timeout=60, env={"NDIST_ENGINE": "python", "NDIST_TRANSPORT": "tcp"})
    assert res[1] == NOTICE, res[1]
