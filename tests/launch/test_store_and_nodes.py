"""The launcher hosts the job's store; agents of several nodes rendezvous through it."""

import json
import os
import secrets

import pytest

from tests.launch.launch_helpers import free_port

pytestmark = pytest.mark.timeout(90)

USE_STORE = """
import json, os
from ndist.runtime.store import TCPStore
host, _, port = os.environ["NDIST_STORE"].rpartition(":")
store = TCPStore(host, int(port), is_master=False, timeout=30)  # authenticates with NDIST_SECRET
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
store.set(f"hello/{rank}", os.environ["LOCAL_RANK"])
store.wait([f"hello/{r}" for r in range(world)])  # a barrier across every node
with open(f"seen-{rank}.json", "w") as f:
    json.dump({"world": world, "local": [store.get(f"hello/{r}").decode() for r in range(world)],
               "node": os.environ["NODE_RANK"], "master": os.environ["MASTER_ADDR"],
               "master_port": os.environ["MASTER_PORT"]}, f)
"""


def test_ranks_share_the_launchers_store(launcher):
    launcher.script(USE_STORE)
    r = launcher.run("--nproc-per-node", 3, "job.py")
    assert r.returncode == 0, r.stderr
    for rank in range(3):
        seen = json.loads(open(os.path.join(launcher.cwd, f"seen-{rank}.json")).read())
        assert seen["world"] == 3 and seen["local"] == ["0", "1", "2"]


def test_store_refuses_a_process_without_the_job_secret(launcher):
    launcher.script("""
import os, sys
from ndist.runtime.store import TCPStore
host, _, port = os.environ["NDIST_STORE"].rpartition(":")
try:
    TCPStore(host, int(port), is_master=False, timeout=5, secret="not-the-job-secret")
except Exception as err:
    print("refused:", type(err).__name__)
    sys.exit(0)
sys.exit("joined without the secret")
""")
    r = launcher.run("--nproc-per-node", 1, "job.py")
    assert r.returncode == 0, r.stderr
    assert "refused:" in r.stdout


#: a rank that says it is up, then waits to be stopped
UP_AND_WAIT = "import os, time; open(f'up-{os.environ[\"RANK\"]}', 'w').close(); time.sleep(60)\n"


def test_two_nodes_rendezvous(launcher):
    launcher.script(USE_STORE)
    n0, n1 = launcher.nodes(each=(("--nproc-per-node", 2), ("--nproc-per-node", 1)), first=1)
    (out0, err0), (out1, err1) = launcher.communicate([n0, n1])
    assert n0.returncode == 0 and n1.returncode == 0, (err0, err1)
    seen = [json.loads(open(os.path.join(launcher.cwd, f"seen-{r}.json")).read()) for r in range(3)]
    assert all(s["world"] == 3 for s in seen)
    assert seen[0]["local"] == ["0", "1", "0"]  # node 0 has ranks 0, 1; node 1 has rank 2
    assert [s["node"] for s in seen] == ["0", "0", "1"]
    # every rank of both nodes gets node 0's one free port for rank 0's own store (torch's env://)
    assert len({s["master_port"] for s in seen}) == 1
    assert int(seen[0]["master_port"]) != int(n0.args[n0.args.index("--master-port") + 1])


def test_failure_on_one_node_stops_the_other(launcher):
    launcher.script("""
import os, sys, time
if os.environ["RANK"] == "2":
    time.sleep(0.3)
    raise OSError("disk on fire")
time.sleep(120)
""")
    n0, n1 = launcher.nodes("--nproc-per-node", 2)
    (out0, err0), (out1, err1) = launcher.communicate([n0, n1])
    assert n1.returncode == 1 and n0.returncode == 1, (err0, err1)
    for err in (err0, err1):  # both agents name the rank that failed, on node 1
        assert "rank       : 2 (local rank 0)" in err and "OSError: disk on fire" in err


def test_node_rank_taken_twice_is_an_error(launcher):
    import signal

    launcher.script(UP_AND_WAIT)
    common, env = job = launcher.node_job()
    n0, n1 = launcher.nodes(job=job)
    try:
        launcher.wait_files("up-", (0, 1), 30, "both nodes")
        dup = launcher.run(*common, "--node-rank", 1, "job.py", env=env, timeout=30)
        host_too = launcher.run(*common, "--node-rank", 0, "job.py", env=env, timeout=30)
    finally:
        for p in (n0, n1):
            p.send_signal(signal.SIGTERM)
        errs = [p.communicate(timeout=30)[1] for p in (n0, n1)]
    assert dup.returncode == 2 and "--node-rank 1 is already taken by the agent on host" in dup.stderr
    assert host_too.returncode == 2 and "cannot host the job's store" in host_too.stderr
    # Each agent got SIGTERM itself or was stopped by the other one's: both say so.
    assert n0.returncode == n1.returncode == 128 + signal.SIGTERM, errs
    assert all("interrupted by SIGTERM" in e for e in errs)


def test_interrupting_one_node_stops_the_job(launcher):
    import signal

    launcher.script(UP_AND_WAIT)
    n0, n1 = launcher.nodes()
    try:
        launcher.wait_files("up-", (0, 1), 30, "both nodes")
        n1.send_signal(signal.SIGINT)
        (_, err0), (_, err1) = launcher.communicate([n0, n1], timeout=30)
    finally:
        n0.kill()
        n1.kill()
    assert n1.returncode == n0.returncode == 128 + signal.SIGINT
    assert "interrupted by SIGINT on node 1" in err0 and "interrupted by SIGINT:" in err1


def test_rendezvous_timeout_names_missing_nodes(launcher):
    launcher.script("open('ran', 'w').close()\n")
    port = free_port()
    r = launcher.run("--nnodes", 3, "--master-port", port, "--rdzv-timeout", 0.5, "job.py",
                     env={**os.environ, "NDIST_SECRET": secrets.token_hex(32)}, timeout=30)
    assert r.returncode == 2
    assert "rendezvous timed out after 0.5 s: nodes [1, 2] of 3 did not join" in r.stderr
    assert not os.path.exists(os.path.join(launcher.cwd, "ran"))


def test_two_nodes_restart_together(launcher):
    # Attempt 0: rank 2 (node 1) fails after every rank joined the store; both nodes restart
    # and attempt 1 rendezvouses again on the same store and succeeds.
    launcher.script("""
import os
from ndist.runtime.store import TCPStore
host, _, port = os.environ["NDIST_STORE"].rpartition(":")
store = TCPStore(host, int(port), is_master=False, timeout=30)
rank, world, k = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), os.environ["NDIST_RESTART_COUNT"]
store.set(f"{k}/hello/{rank}", "1")
store.wait([f"{k}/hello/{r}" for r in range(world)])
if k == "0":
    if rank == 2:
        raise SystemExit(3)
    import time
    time.sleep(60)  # stopped by the launchers
open(f"done-{rank}", "w").close()
""")
    n0, n1 = launcher.nodes("--nproc-per-node", 2, "--max-restarts", 1)
    (_, err0), (_, err1) = launcher.communicate([n0, n1])
    assert n0.returncode == 0 and n1.returncode == 0, (err0, err1)
    for err in (err0, err1):
        assert "rank 2 failed (exit code 3); restarting the worker group (restart 1 of 1)" in err
    assert all(os.path.exists(os.path.join(launcher.cwd, f"done-{r}")) for r in range(4))


def test_init_process_group_under_the_launcher(launcher):
    import ndist.distributed as dist

    if not dist.registered_backends():
        pytest.skip("no collective backend in this checkout yet (init_process_group needs one)")
    launcher.script("""
import os, sys
import ndist
import ndist.distributed as dist
dist.init_process_group()
assert dist.get_rank() == int(os.environ["RANK"]) and dist.get_world_size() == int(os.environ["WORLD_SIZE"])
if os.environ["NDIST_RESTART_COUNT"] == "0":
    if dist.get_rank() == 1:
        sys.exit(5)  # the restarted group must rendezvous again from scratch
    import time
    time.sleep(60)  # stopped by the launcher
t = ndist.ones(1)
dist.all_reduce(t)
dist.destroy_process_group()
print("joined", int(t.item()))
""")
    r = launcher.run("--nproc-per-node", 3, "--max-restarts", 1, "job.py")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == ["[rank0]:joined 3", "[rank1]:joined 3", "[rank2]:joined 3"]
