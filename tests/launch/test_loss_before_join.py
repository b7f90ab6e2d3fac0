"""A rank that ends before it joins ``init_process_group`` is named at once (issue 44, part 1).

Under ``ndistrun`` the agent sees every rank end and marks the ones that had not joined in
the job's store (ndist/launch/_ends.py, ndist/runtime/_ended.py): the ranks waiting for it in
``init_process_group`` raise ``DistRankFailureError`` naming it, how it ended and its exit code
or signal. Before, they waited their whole init timeout (here 120 s) with ``--on-failure
continue``, and with ``stop`` for a rank that exited 0 (counted as finished). Each test bounds
the time from the loss to the end generously (< 10 s: a loaded 2-core machine), checks that
no rank is left and no /dev/shm file of the job."""

import os
import secrets
import socket
import subprocess
import sys
import time

import pytest

from ndist.testing import launch_nodes, make_hosts, ndist_env, outputs, wait_launchers
from tests.reliability.before_join import JOB, nothing_left, read

pytestmark = pytest.mark.timeout(120)

# HOW: the cause the others' error names, how it says the rank ended, the summary's "exit" line, the status
EXIT = {"exit0": ("exited", "exit code 0", "exit code 0", 1),
        "kill": ("died", "killed by SIGKILL", "killed by SIGKILL (exit status 137)", 137)}
LABEL = ", before it joined the group (init_process_group)"


def _summary(err):
    return err[err.index("=" * 72):]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(procs, timeout=90):
    """Wait for every launcher; one still running after ``timeout`` s fails the test (killed)."""
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout))
    except subprocess.TimeoutExpired:
        pytest.fail("a launcher did not end: the ranks waited for the lost rank in init_process_group")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return outs, time.time()


@pytest.mark.parametrize("how", ["exit0", "kill"])
def test_stop_names_a_rank_lost_before_it_joined(launcher, how):
    cause, said, exit_line, status = EXIT[how]
    launcher.script(JOB)
    p = launcher.popen_to_kill("--nproc-per-node", 4, "job.py", env={**os.environ, "VICTIM": "2", "HOW": how})
    ((out, err),), ended = _run([p])
    d = launcher.cwd
    took = ended - read(d, "lost-at")
    assert took < 10, took
    assert p.returncode == status, err
    s = _summary(err)
    assert "job.py FAILED (attempt 1 of 1)" in s
    assert f"root cause (first rank to fail):\n  rank       : 2 (local rank 2)" in s, s
    assert f"  exit       : {exit_line}{LABEL}" in s, s
    assert "joined" not in "".join(os.listdir(d))
    if how == "exit0":  # the others raised, which ended the job (the first to exit stops the rest: at least one
        # recorded it); after a kill the launcher stops them at once, maybe before they raise
        assert ("rank 2 (local rank 2) exited with exit code 0 before it joined the group (init_process_group), "
                "and other ranks waited for it there: it counts as failed") in err
        errors = [read(d, f"error-{r}") for r in (0, 1, 3) if os.path.exists(os.path.join(d, f"error-{r}"))]
        assert errors
        for e in errors:
            assert (e["type"], e["failed_ranks"], e["causes"]) == ("DistRankFailureError", [2], [cause]), e
            assert f"rank 2 ({socket.gethostname()}) exited before it joined the group (exit code 0" in e["message"]
    nothing_left(d, range(4))


@pytest.mark.parametrize("how", ["exit0", "kill"])
def test_continue_the_others_init_raises_naming_the_rank(launcher, how):
    cause, said, exit_line, status = EXIT[how]
    launcher.script(JOB)
    p = launcher.popen_to_kill("--nproc-per-node", 4, "--on-failure", "continue", "job.py",
                       env={**os.environ, "VICTIM": "2", "HOW": how})
    ((out, err),), ended = _run([p])
    d = launcher.cwd
    lost_at = read(d, "lost-at")
    for r in (0, 1, 3):
        e = read(d, f"error-{r}")
        assert (e["type"], e["failed_ranks"], e["causes"]) == ("DistRankFailureError", [2], [cause]), e
        assert (f"init_process_group on rank {r}: rank 2 ({socket.gethostname()}) {cause} before it joined the "
                f"group ({said}, seen by the launcher)") in e["message"], e
        assert e["at"] - lost_at < 10, (r, e["at"] - lost_at)
    assert ended - lost_at < 10
    # nobody can finish: every rank is lost, the root cause is rank 2
    assert p.returncode == status, err
    s = _summary(err)
    assert "4 of 4 ranks lost: fewer than --min-nproc 1 could still finish" in s, s
    assert "root cause (first rank to fail):\n  rank       : 2 (local rank 2)" in s and exit_line + LABEL in s, s
    assert s.count("DistRankFailureError") == 3, s
    nothing_left(d, range(4))


def test_a_rank_that_joined_then_exited_0_is_not_blamed(launcher):
    # Rank 2 joins, then exits 0 without destroy while the others still need it: the member watch
    # names it in their collective (cause "exited"), and the launcher does not call it a loss
    # before init: it had joined.
    launcher.script("""
import os, sys
import numpy as np
import ndist.distributed as dist
dist.init_process_group("socket", timeout=60)
if dist.get_rank() == 2:
    sys.exit(0)
try:
    dist.all_reduce(np.ones(4))
except dist.DistRankFailureError as err:
    print("failed", 2 in err.failed_ranks, set(err.causes), flush=True)  # (a survivor that raised first may be in it too)
    # every survivor raises only once all three printed: the first to fail ends the job (stop)
    here = os.path.dirname(os.path.abspath(__file__))
    open(os.path.join(here, f"printed-{dist.get_rank()}"), "w").close()
    import time
    end = time.monotonic() + 30
    while time.monotonic() < end and not all(os.path.exists(os.path.join(here, f"printed-{k}")) for k in (0, 1, 3)):
        time.sleep(0.01)
    raise
""")
    r = launcher.run("--nproc-per-node", 4, "job.py")
    assert r.returncode == 1, r.stderr
    assert sorted(r.stdout.splitlines()) == [f"[rank{k}]:failed True {{'exited'}}" for k in (0, 1, 3)], r.stdout
    assert "before it joined" not in r.stderr
    assert "root cause (first rank to fail):\n  rank       : 2" not in r.stderr


def test_clean_jobs_are_unchanged(launcher):
    # A job whose ranks join, work and destroy their group; then a program that never joins,
    # one rank of which exits 0 at once while the others sleep: both succeed, no summary.
    launcher.script("""
import numpy as np
import ndist.distributed as dist
dist.init_process_group("socket", timeout=60)
x = np.ones(4)
dist.all_reduce(x)
assert (x == 4).all()
dist.destroy_process_group()
""")
    r = launcher.run("--nproc-per-node", 4, "job.py")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    launcher.script("import os, time\nif os.environ['RANK'] != '1':\n    time.sleep(1)\n", name="plain.py")
    for extra in ((), ("--on-failure", "continue")):
        r = launcher.run("--nproc-per-node", 3, *extra, "plain.py")
        assert r.returncode == 0 and r.stderr == "", r.stderr


# ---------------------------------------------------------------- two nodes


def _two_nodes(launcher, env, argv, per_node=(2, 2)):
    """``ndistrun --nnodes 2`` twice on this host (``env`` holds the job's NDIST_SECRET)."""
    port = _free_port()
    common = ["--nnodes", 2, "--master-addr", "127.0.0.1", "--master-port", port, "--rdzv-timeout", 30]
    return [launcher.popen_to_kill(*common, "--node-rank", n, "--nproc-per-node", per_node[n], *argv[n], env=env)
            for n in (0, 1)]


def test_two_nodes_continue_a_rank_killed_before_it_joined(launcher):
    launcher.script(JOB)
    argv = [("--on-failure", "continue", "job.py")] * 2
    procs = _two_nodes(launcher, {**os.environ, "VICTIM": "2", "HOW": "kill", "NDIST_SECRET": secrets.token_hex(32)},
                       argv)
    outs, ended = _run(procs)
    d = launcher.cwd
    lost_at = read(d, "lost-at")
    assert ended - lost_at < 10
    for r in (0, 1, 3):  # on both nodes
        e = read(d, f"error-{r}")
        assert (e["type"], e["failed_ranks"], e["causes"]) == ("DistRankFailureError", [2], ["died"]), e
        assert e["at"] - lost_at < 10, (r, e["at"] - lost_at)
    assert [p.returncode for p in procs] == [137, 137], outs
    for _, err in outs:  # both launchers name rank 2 as the root cause
        s = _summary(err)
        assert "root cause (first rank to fail):\n  rank       : 2 (local rank 0)" in s, s
        assert "killed by SIGKILL (exit status 137)" + LABEL in s, s
    nothing_left(d, range(4))


def test_two_nodes_a_rank_that_never_starts_on_one_node(launcher):
    # Node 1's interpreter path is wrong: its rank (2) never starts (exit code 127). With
    # "continue", node 0's ranks raise in init_process_group naming it; with "stop" both
    # launchers stop at once (node 0's ranks may be stopped before they join, or raise first).
    launcher.script(JOB)
    bad = os.path.join(launcher.cwd, "no-such-dir", "python3")
    for mode in ("continue", "stop"):
        for name in os.listdir(launcher.cwd):
            if name.startswith(("error-", "pid-", "secret-")):
                os.unlink(os.path.join(launcher.cwd, name))
        argv = [("--on-failure", mode, "--no-python", sys.executable, "job.py"),
                ("--on-failure", mode, "--no-python", bad, "job.py")]
        started = time.time()
        secret = secrets.token_hex(32)
        procs = _two_nodes(launcher, {**os.environ, "VICTIM": "-1", "HOW": "-", "NDIST_SECRET": secret}, argv,
                           per_node=(2, 1))
        outs, ended = _run(procs)
        assert ended - started < 30, ended - started  # (with "continue", before: 120 s, the init timeout)
        assert f"ndistrun: cannot run {bad!r}: No such file or directory" in outs[1][1]
        assert procs[1].returncode == 127, outs
        s = _summary(outs[1][1])
        assert "root cause (first rank to fail):\n  rank       : 2 (local rank 0)" in s and "exit code 127" in s, s
        if mode == "continue":
            assert procs[0].returncode == 127, outs
            s0 = _summary(outs[0][1])
            assert "root cause (first rank to fail):\n  rank       : 2 (local rank 0)" in s0 and "exit code 127" in s0
            for r in (0, 1):
                e = read(launcher.cwd, f"error-{r}")
                assert (e["type"], e["failed_ranks"], e["causes"]) == ("DistRankFailureError", [2], ["exited"]), e
                assert "rank 2 (" in e["message"] and "(exit code 127, seen by the launcher)" in e["message"], e
        else:
            assert procs[0].returncode in (127, 1), outs
            # its summary's root cause, or its ranks' errors under "other failures" / on stderr, name it
            assert "exit code 127" in outs[0][1], outs[0][1]
            assert "rank       : 2 (local rank 0)" in outs[0][1] or "rank 2 (" in outs[0][1], outs[0][1]
        nothing_left(launcher.cwd, range(2), secret)  # (with "stop", node 0's ranks may be stopped before they
        # record anything: the launchers kill their process groups)


def test_two_nodes_a_script_missing_on_one_node_refuses_the_job(launcher):
    # python mode: node 1 has no such script. Its agent still joins the nodes' rendezvous and says
    # so there: every node refuses the job at once (exit status 2), none waits --rdzv-timeout.
    launcher.script("open('ran', 'w').close()\n")
    started = time.time()
    procs = _two_nodes(launcher, {**os.environ, "NDIST_SECRET": secrets.token_hex(32)},
                       [("job.py",), ("missing.py",)], per_node=(2, 1))
    outs, ended = _run(procs)
    assert ended - started < 20, ended - started  # (before: node 0 waited the 30 s --rdzv-timeout)
    assert [p.returncode for p in procs] == [2, 2], outs
    said = (f"ndistrun: error: node 1 ({socket.gethostname()}) cannot start its ranks: script: no such file: "
            "'missing.py' (use -m for a module, --no-python for an executable)")
    assert all(said in err for _, err in outs), outs
    assert not os.path.exists(os.path.join(launcher.cwd, "ran"))


# ---------------------------------------------------------------- two hosts (network namespaces)


@pytest.mark.timeout(180)
def test_two_hosts_stop_a_rank_that_exited_0_before_it_joined(tmp_path):
    # 2 network namespaces x 2 ranks (ndist.testing.make_hosts; skips without root): rank 2, on the
    # second host, exits 0 once the others wait in init_process_group. Every other rank raises
    # naming it, and both launchers fail; the second host's names it as the root cause.
    script = tmp_path / "job.py"
    script.write_text(JOB)
    secret = secrets.token_hex(32)
    with make_hosts(2, pytest.skip) as hosts:
        procs = launch_nodes(hosts, 2, [str(script)], ndist_env(VICTIM="2", HOW="exit0", NDIST_SECRET=secret),
                             tmp_path)
        codes = wait_launchers(procs, 90)
        ended = time.time()
        outs = outputs(tmp_path, 2)
    d = str(tmp_path)
    took = ended - read(d, "lost-at")
    assert took < 10, took
    assert codes == [1, 1], (codes, [e[-3000:] for _, e in outs])
    s = _summary(outs[1][1])
    assert "root cause (first rank to fail):\n  rank       : 2 (local rank 0)" in s, s
    assert "exit code 0" + LABEL in s, s
    errors = [read(d, f"error-{r}") for r in (0, 1, 3) if os.path.exists(os.path.join(d, f"error-{r}"))]
    assert errors
    for e in errors:
        assert (e["type"], e["failed_ranks"], e["causes"]) == ("DistRankFailureError", [2], ["exited"]), e
        assert "exited before it joined the group (exit code 0, seen by the launcher)" in e["message"], e
    assert "rank 2 (" in outs[0][1] and "exited before it joined the group (exit code 0" in outs[0][1]
    nothing_left(d, range(4), secret)
