"""No stranger can stall a job (issue 14, item 7): slow or silent clients on every
listener of a rank (its data listener over TCP and the abstract Unix socket, the
job's store) hold no one else up. The bound on the p2p set-up is functional (it
tests a stall of seconds, not speed), with a wide margin."""

import pytest

from ndist.testing import run_ranks

pytestmark = pytest.mark.timeout(180)


def _with_strangers(rank, size, n_slow):
    import errno
    import os
    import socket
    import threading
    import time

    import numpy as np

    import ndist.distributed as dist
    from ndist.runtime import resolve_group

    pg = resolve_group(None)
    dist.all_reduce(np.ones(4))  # the collective mesh is up; p2p channels open on first use
    mesh = pg.backend_for("cpu")._mesh
    store_host, _, store_port = os.environ["NDIST_STORE"].rpartition(":")
    targets = [(socket.AF_INET, ("127.0.0.1", mesh.info["port"])), (socket.AF_INET, (store_host, int(store_port)))]
    if mesh.info.get("unix"):
        targets.append((socket.AF_UNIX, "\0" + mesh.info["unix"]))
    strangers, connected = [], 0
    for family, addr in targets:
        for i in range(n_slow):
            s = socket.socket(family, socket.SOCK_STREAM)
            s.setblocking(False)  # (a listener that stopped accepting would block a connect)
            code = s.connect_ex(addr)
            if code not in (0, errno.EINPROGRESS):
                s.close()
                continue
            connected += 1
            strangers.append((s, i % 2 == 0))  # even: one byte every 0.5 s; odd: silent
    stop = threading.Event()

    def trickle():
        while not stop.wait(0.5):
            for s, slow in strangers:
                if slow:
                    try:
                        s.send(b"N")
                    except OSError:
                        pass

    threading.Thread(target=trickle, daemon=True).start()
    time.sleep(1.0)  # every listener has taken them in (or is stuck on the first)
    dist.barrier()
    x = np.arange(4.0) + rank
    y = np.empty(4)
    t0 = time.monotonic()
    if rank == 0:  # both directions: each rank's listener is dialled once
        dist.send(x, 1)
        dist.recv(y, 1)
    elif rank == 1:
        dist.recv(y, 0)
        dist.send(x, 0)
    p2p_s = time.monotonic() - t0
    t0 = time.monotonic()
    group = dist.new_group(list(range(size)))
    z = np.ones(4)
    dist.all_reduce(z, group=group)
    group_s = time.monotonic() - t0
    stop.set()
    for s, _ in strangers:
        s.close()
    peer_sent = (np.arange(4.0) + (1 - rank)).tolist()
    return {"p2p_s": p2p_s, "group_s": group_s, "connected": connected, "ok": y.tolist() == peer_sent,
            "z": z.tolist()}


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_fifty_slow_clients_per_listener_do_not_stall_p2p_or_new_groups(transport):
    res = run_ranks(_with_strangers, 2, args=(50,), transport=transport, timeout=40)
    for r in res:
        assert r["ok"] and r["z"] == [2.0] * 4, r
        assert r["connected"] >= 100, r  # TCP listener and store at least; Unix too with auto
        # Alone this takes ~10 ms; a stall (one client holding the listener) took the whole
        # 40 s run timeout. The bound leaves room for a loaded 2-core CI machine, where the
        # receiver's background watch connection (1 s per attempt) can need a second try.
        assert r["p2p_s"] < 3.0, res
        assert r["group_s"] < 3.0, res
