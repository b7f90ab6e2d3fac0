"""A 3-host job: three network namespaces x 2 ranks (and 3, 1, 2), ``ndistrun --nnodes 3``, the
socket backend's two-level collectives (all_reduce small and large, broadcast from
every root, barrier, all_gather) checked against their expected values, float
results bit-identical on every rank, and the flat algorithms (``NDIST_ALGO=flat``)
giving the same answers; after the first (two-level) all_reduce only each host's leader
holds links across hosts. The same on the native engine (its two levels: shared memory
inside a host, TCP between the leaders), and a rank SIGKILLed in the middle of its large
two-level all_reduces: every survivor, on every host, raises naming it. Leaves no
namespace, process or /dev/shm file behind.

The ranks are started by ``run_ranks(..., hosts=hosts)``. Needs root, iproute2 and
CAP_NET_ADMIN (``ndist.testing.make_hosts``); skips otherwise."""

from __future__ import annotations

import atexit
import hashlib
import os
import signal
import subprocess
import time
from datetime import timedelta

import numpy as np
import pytest

from ndist.collectives.backends.socket.native._engine import extension as native_extension
from ndist.testing import make_hosts, namespaces, run_ranks
from tests.collectives.backends._socket_bodies import record_schedules

HOSTS = 3


def _netns() -> int:
    """The inode of this process's network namespace (the same as its file under /var/run/netns)."""
    return os.stat("/proc/self/ns/net").st_ino


def _collectives(rank, n):
    import ndist.distributed as dist
    from ndist.runtime import resolve_group

    seen = record_schedules()
    dist.init_process_group("socket", timeout=timedelta(seconds=30))
    mesh = resolve_group(None).backend_for("cpu")._mesh
    w = np.full(7, rank + 1, np.int32)
    dist.all_reduce(w)  # the first collective: two-level, small
    assert (w == n * (n + 1) // 2).all(), "wrong first all_reduce"
    cross = [p for p in mesh.linked if not mesh.same_host(p)]  # links opened by it, across hosts
    digests = []
    for count in (1001, 300_001):  # leaders: recursive doubling; ring (3 hosts)
        x = np.random.default_rng(rank).standard_normal(count).astype(np.float32)
        dist.all_reduce(x)
        want = sum(np.random.default_rng(r).standard_normal(count).astype(np.float64) for r in range(n))
        assert np.allclose(x, want, rtol=1e-4, atol=1e-3), "wrong float all_reduce"
        digests.append(hashlib.sha256(x.tobytes()).hexdigest())
    y = np.full(70_000, rank + 1, np.int64)
    dist.all_reduce(y, op=dist.ReduceOp.MAX)
    assert (y == n).all(), "wrong MAX all_reduce"
    z = np.full(5, rank + 1, np.int32)
    dist.all_reduce(z)
    assert (z == n * (n + 1) // 2).all(), "wrong small all_reduce"
    for root in range(n):
        b = np.full(9 + root, rank, np.float64) if rank == root else np.zeros(9 + root)
        dist.broadcast(b, root)
        assert (b == root).all(), f"wrong broadcast from {root}"
    big = np.arange(100_000, dtype=np.float32) if rank == 4 else np.zeros(100_000, np.float32)
    dist.broadcast(big, 4)
    assert (big == np.arange(100_000)).all(), "wrong large broadcast"
    outs = [np.empty(3 + r, np.int16) for r in range(n)]
    dist.all_gather(outs, np.full(3 + rank, rank, np.int16))
    assert all((outs[r] == r).all() for r in range(n)), "wrong all_gather"
    dist.barrier()
    t = np.empty(2 * n, np.int64)
    dist.all_to_all_single(t, np.arange(2 * n, dtype=np.int64) + 100 * rank)
    assert (t == np.array([[100 * r + 2 * rank, 100 * r + 2 * rank + 1] for r in range(n)]).ravel()).all()
    dist.barrier()
    nat = resolve_group(None).backend_for("cpu")._native
    rec = {"node": _netns(), "digests": digests, "algos": sorted(set(seen)), "cross": cross,
           "engine": dist.get_engine(), "group": type(nat.g).__name__ if nat else None}
    dist.destroy_process_group()
    return rec


def _run_job(hosts, algo: str, per_host, native_tcp: str = "0") -> list:
    """``native_tcp``: ``NDIST_NATIVE_TCP`` (``0``: the Python engine's schedules; ``auto``,
    the default: the native engine over TCP)."""
    res = run_ranks(_collectives, sum(per_host), hosts=hosts, per_host=per_host, init=False, timeout=150,
                    env={"NDIST_ALGO": algo, "NDIST_NATIVE_TCP": native_tcp})
    assert res.launcher_exitcodes == [0] * HOSTS, res.launcher_exitcodes
    assert not res.shm_left, res.shm_left
    return res


def _no_process_in(hosts):
    for ns in hosts.ns:  # every rank and launcher is gone before the namespaces are
        assert subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split() == []


@pytest.mark.timeout(420)
def test_three_hosts_two_level_collectives():
    with make_hosts(HOSTS, pytest.skip) as hosts:
        two = _run_job(hosts, "auto", (2, 2, 2))
        flat = _run_job(hosts, "flat", (2, 2, 2))
        uneven = _run_job(hosts, "auto", (3, 1, 2))
        native = _run_job(hosts, "auto", (2, 2, 2), native_tcp="auto")
        _no_process_in(hosts)
        inode = {ns: os.stat(f"/var/run/netns/{ns}").st_ino for ns in hosts.ns}
    algos = ["bruck", "two_level/binomial", "two_level/bruck", "two_level/dissemination",
             "two_level/recursive_doubling", "two_level/ring"]
    for res, layout in ((two, (2, 2, 2)), (uneven, (3, 1, 2))):
        nodes = [hosts.ns[h] for h, k in enumerate(layout) for _ in range(k)]
        assert [r["node"] for r in res] == [inode[ns] for ns in nodes]  # the ranks really sit on 3 hosts
        assert all(r["digests"] == res[0]["digests"] for r in res)  # bit-identical on every rank
        assert res[0]["algos"] == algos
        # after a two-level all_reduce only the host leaders (each host's lowest rank) hold
        # links across hosts, each to the other leaders only
        leaders = [nodes.index(ns) for ns in hosts.ns]
        assert {r: rec["cross"] for r, rec in enumerate(res)} == {
            r: ([q for q in leaders if q != r] if r in leaders else []) for r in range(len(res))}, layout
    assert all(r["digests"] == flat[0]["digests"] for r in flat)
    assert {r["engine"] for res in (two, flat, uneven) for r in res} == {"python"}
    # the default across hosts: the native engine over TCP, direct algorithms (no schedule), a
    # link from every rank to every other, results bit-identical on every rank (without the
    # compiled extension, the Python engine runs it: ndist installs without a compiler)
    nodes = [hosts.ns[h] for h in range(HOSTS) for _ in range(2)]
    assert [r["node"] for r in native] == [inode[ns] for ns in nodes]
    if native_extension() is None:
        assert {r["engine"] for r in native} == {"python"}
        return
    assert {r["engine"] for r in native} == {"native"}
    assert {r["group"] for r in native} == {"TwoLevelGroup"}  # (2 ranks on every host)
    assert all(r["digests"] == native[0]["digests"] and r["algos"] == [] for r in native)
    assert {r: rec["cross"] for r, rec in enumerate(native)} == {
        r: [q for q in range(6) if nodes[q] != nodes[r]] for r in range(6)}
    assert not any(a.startswith("two_level") for r in flat for a in r["algos"])
    assert not any(hosts.tag in name for name in namespaces())


def _killed_mid_all_reduce(rank, n):
    import ndist.distributed as dist
    from ndist.runtime import resolve_group

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stay to report; a launcher SIGKILLs after its grace (5 s)
    dist.init_process_group("socket", timeout=timedelta(seconds=60))
    backend = resolve_group(None).backend_for("cpu")
    x = np.full(1 << 20, rank + 1.0, np.float32)  # 4 MiB: two levels
    done = 0
    try:
        while True:
            if rank == 3 and done == 30:
                os.kill(os.getpid(), signal.SIGKILL)  # host 1's non-leader, mid-loop
            x[:] = rank + 1.0
            dist.all_reduce(x)
            assert (x == n * (n + 1) / 2).all(), "wrong all_reduce"
            done += 1
    except dist.DistError as err:
        kind = type(backend._native.g).__name__ if backend._native is not None else None
        # the rank still ends with an error status (5) once it has reported, as a job's would
        atexit.register(os._exit, 5)
        return {"t": time.time(), "type": type(err).__name__, "rank": getattr(err, "rank", None),
                "msg": str(err), "done": done, "group": kind}


@pytest.mark.timeout(240)
def test_a_rank_killed_mid_two_level_all_reduce_is_named_on_every_host():
    """Rank 3 (host 1's second rank) SIGKILLs itself between 4 MiB all_reduces in two levels:
    its leader finds it dead in shared memory, the leaders learn it over TCP, and every
    survivor on the other hosts raises a typed error naming rank 3, well before the group's
    60 s timeout (rank 2, on rank 3's host, too unless its launcher stopped it first: a
    launcher ends a node's ranks when one of them dies; the others ignore SIGTERM to stay and
    report, and are SIGKILLed after the launcher's 5 s grace); the launchers exit non-zero and
    no /dev/shm file stays."""
    if native_extension() is None:
        pytest.skip("the native engine is not built")
    with make_hosts(HOSTS, pytest.skip) as hosts:
        t0 = time.time()
        res = run_ranks(_killed_mid_all_reduce, 6, hosts=hosts, init=False, may_die=[2, 3], timeout=150)
        took = time.time() - t0
        _no_process_in(hosts)
    codes = res.launcher_exitcodes
    assert None not in codes and all(c != 0 for c in codes), codes
    errs = {r: e for r, e in enumerate(res) if e is not None}
    assert {0, 1, 4, 5} <= set(errs), errs
    for r, e in errs.items():
        assert e["group"] == "TwoLevelGroup", e
        assert e["type"] in ("DistNetworkError", "DistRankFailureError") and e["rank"] == 3, (r, e)
        assert e["done"] >= 29, e
    assert took < 60, took
    assert not res.shm_left, res.shm_left
