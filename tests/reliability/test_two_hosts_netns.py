"""Two hosts on one machine: two network namespaces joined by a veth pair
(10.77.0.1/24 and 10.77.0.2/24, no other traffic), ``ndistrun --nnodes 2`` with
one launcher per namespace over TCP; then the link is cut mid-run and every rank
must fail with a typed error and both launchers exit non-zero, never hang.

Needs root, iproute2 and CAP_NET_ADMIN; skips otherwise (installs nothing)."""

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from ndist.testing import free_port_in, make_hosts, outputs

ROOT = Path(__file__).resolve().parents[2]

_JOB = """
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


def _sh(*args, check=True):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=30, check=check)


@pytest.fixture
def two_hosts():
    with make_hosts(2, pytest.skip) as hosts:
        yield tuple(hosts.ns), tuple(hosts.veth)


def _outputs(folder):
    return outputs(folder, 2)


def _free_port_in(ns: str) -> int:
    return free_port_in(ns)


@pytest.mark.timeout(180)
def test_two_node_job_across_namespaces_then_the_link_is_cut(two_hosts, tmp_path):
    (ns_a, ns_b), (veth_a, _veth_b) = two_hosts
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(_JOB))
    # the store port: free in namespace A (nobody else can bind there between this and the launch)
    port = _free_port_in(ns_a)
    env = dict(os.environ, PYTHONPATH=str(ROOT), NDIST_SECRET=uuid.uuid4().hex, NDIST_TRANSPORT="tcp")
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(k, None)
    launchers = []
    for node, ns in enumerate((ns_a, ns_b)):
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "ndist.launch", "--nnodes", "2", "--node-rank",
               str(node), "--nproc-per-node", "2", "--master-addr", "10.77.0.1", "--master-port", str(port),
               "--rdzv-timeout", "20", "--term-timeout", "5", str(job), str(tmp_path)]
        # output to files, not pipes: nobody reads a pipe while we wait (a full pipe would block the launcher)
        logs = (open(tmp_path / f"node{node}.out", "w"), open(tmp_path / f"node{node}.err", "w"))
        launchers.append(subprocess.Popen(cmd, env=dict(env, NDIST_TEST_NODE=ns), stdout=logs[0], stderr=logs[1]))
        for f in logs:
            f.close()
    try:
        deadline = time.monotonic() + 90
        while not all((tmp_path / f"ready{r}").exists() for r in range(4)):
            if time.monotonic() > deadline or any(p.poll() is not None for p in launchers):
                pytest.fail(f"job did not start across the namespaces: {_outputs(tmp_path)}")
            time.sleep(0.1)
        nodes = {(tmp_path / f"ready{r}").read_text() for r in range(4)}
        assert nodes == {ns_a, ns_b}  # both "hosts" really run ranks
        cut = time.time()
        _sh("ip", "-n", ns_a, "link", "set", veth_a, "down")
        codes = []
        for p in launchers:
            try:
                codes.append(p.wait(timeout=max(1.0, 90 - (time.time() - cut))))
            except subprocess.TimeoutExpired:
                codes.append("hang")
        took = time.time() - cut
    finally:
        for p in launchers:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
    outs = _outputs(tmp_path)
    errs_text = ["\n".join(ln for ln in o[1].splitlines() if "ndistrun" in ln or "Error" in ln)[-5000:] for o in outs]
    assert "hang" not in codes, (codes, errs_text, [f.name for f in tmp_path.iterdir()])
    assert all(c != 0 for c in codes), (codes, errs_text)
    errs = {}
    for r in range(4):
        path = tmp_path / f"err{r}.json"
        if path.exists():
            errs[r] = json.loads(path.read_text())
    # every rank that was not torn down first reported a typed error, well within the bound
    assert errs, (codes, [o[1][-3000:] for o in outs])
    for r, e in errs.items():
        assert e["type"] in ("DistTimeoutError", "DistNetworkError", "DistRankFailureError", "DistStoreError", "DistMismatchError",
                             "DistBackendError"), e
        assert e["ok"] >= 20
        assert e["t"] - cut < 60, e
    timeouts = [e for e in errs.values() if e["type"] == "DistTimeoutError"]
    assert any("not heard from" in e["msg"] or "timed out" in e["msg"] for e in timeouts) or \
        any(e["type"] in ("DistRankFailureError", "DistNetworkError") for e in errs.values()), errs
    assert took < 60, took  # ranks: group timeout 5 s; node 1: 15 s to report; node 0: --rdzv-timeout 20
    assert all("finished without an error" not in o[0] for o in outs)
