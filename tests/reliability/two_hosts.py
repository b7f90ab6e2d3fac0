"""Two hosts on one machine for tests/reliability/test_two_hosts_netns.py: two network
namespaces joined by a veth pair (10.77.0.1/24 and 10.77.0.2/24, no other traffic), one
``ndistrun --nnodes 2`` per namespace over TCP, running ``JOB`` (a script: the hosts'
launchers do not reach a store on the test's loopback). Needs root, iproute2 and
CAP_NET_ADMIN; the ``two_hosts`` fixture skips otherwise.

``JOB``: every rank all-to-alls and all-reduces, checking the results, until its group fails;
after 20 good steps it writes ``ready<rank>`` (its namespace) in the folder it is given; on a
``DistError`` it writes ``err<rank>.json`` and exits 5."""

import subprocess
import sys
import time

import pytest

from ndist.testing import free_port_in, make_hosts, ndist_env, outputs

JOB = """
import json, os, sys, time
from datetime import timedelta
import numpy as np
import ndist.distributed as dist

out = sys.argv[1]
dist.init_process_group("socket", timeout=timedelta(seconds=5))
rank, size = dist.get_rank(), dist.get_world_size()
host = os.environ.get("NDIST_TEST_NODE")
i = 0
ok = 0
try:
    while True:
        x = np.arange(64 * size, dtype=np.float64) + 1000 * rank
        y = np.empty_like(x)
        dist.all_to_all_single(y, x)
        want = np.concatenate([np.arange(64 * rank, 64 * (rank + 1)) + 1000 * r for r in range(size)])
        assert (y == want).all(), "wrong all_to_all result"
        z = np.full(100_000, rank + 1.0)
        dist.all_reduce(z)
        assert (z == size * (size + 1) / 2).all(), "wrong all_reduce result"
        ok += 1
        if ok == 20:
            with open(os.path.join(out, f"ready{rank}"), "w") as f:
                f.write(host)
        if ok > 20000:
            break
        time.sleep(0.01)
except dist.DistError as err:
    with open(os.path.join(out, f"err{rank}.json"), "w") as f:
        json.dump({"t": time.time(), "type": type(err).__name__, "msg": str(err), "ok": ok,
                   "peer": getattr(err, "rank", None), "node": host}, f)
    sys.exit(5)
print("rank", rank, "finished without an error", ok, flush=True)
"""


@pytest.fixture
def two_hosts():
    """``((namespace a, namespace b), (veth a, veth b))``."""
    with make_hosts(2, pytest.skip) as hosts:
        yield tuple(hosts.ns), tuple(hosts.veth)


def start(two_hosts, folder, nproc: int, *options) -> list:
    """``JOB`` (written to ``folder``) under one launcher per namespace, ``nproc`` ranks each,
    with the launcher's ``options``; their output in ``folder/node<i>.out|err``."""
    (ns_a, ns_b), _ = two_hosts
    job = folder / "job.py"
    job.write_text(JOB)
    port = free_port_in(ns_a)  # free in namespace A (nobody else can bind there between this and the launch)
    env = ndist_env(NDIST_TRANSPORT="tcp")
    launchers = []
    for node, ns in enumerate((ns_a, ns_b)):
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "ndist.launch", "--nnodes", "2", "--node-rank",
               str(node), "--nproc-per-node", str(nproc), "--master-addr", "10.77.0.1", "--master-port", str(port),
               *options, str(job), str(folder)]
        # output to files, not pipes: nobody reads a pipe while we wait (a full pipe would block the launcher)
        logs = (open(folder / f"node{node}.out", "w"), open(folder / f"node{node}.err", "w"))
        launchers.append(subprocess.Popen(cmd, env=dict(env, NDIST_TEST_NODE=ns), stdout=logs[0], stderr=logs[1]))
        for f in logs:
            f.close()
    return launchers


def ready(folder, ranks: int, launchers) -> set:
    """Once every rank wrote ``ready<rank>``: the namespaces they run in. A launcher that ends
    first, or 90 s, fails the test."""
    deadline = time.monotonic() + 90
    while not all((folder / f"ready{r}").exists() for r in range(ranks)):
        if time.monotonic() > deadline or any(p.poll() is not None for p in launchers):
            pytest.fail(f"job did not start across the namespaces: {outputs(folder, 2)}")
        time.sleep(0.1)
    return {(folder / f"ready{r}").read_text() for r in range(ranks)}


def cut(two_hosts) -> None:
    """Cut the link between the two namespaces."""
    (ns_a, _), (veth_a, _) = two_hosts
    subprocess.run(["ip", "-n", ns_a, "link", "set", veth_a, "down"], capture_output=True, text=True, timeout=30,
                   check=True)


def stop(launchers) -> None:
    """Kill any launcher still running; reap them all."""
    for p in launchers:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)
