"""A failing rank takes the job down, the summary names it; signals reach every rank; nothing survives."""

import os
import signal
import subprocess

import pytest

from tests.launch.launch_helpers import alive, wait_dead, wait_for

pytestmark = pytest.mark.timeout(60)

# Each rank records its pid and the pid of a grandchild it started, then waits.
RECORD_PIDS = """
import os, subprocess, sys, time
d = os.path.dirname(os.path.abspath(__file__))
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
with open(os.path.join(d, f"pids-{os.environ['RANK']}.tmp"), "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
os.rename(os.path.join(d, f"pids-{os.environ['RANK']}.tmp"), os.path.join(d, f"pids-{os.environ['RANK']}"))
"""


def _pids(d, n):
    out = []
    for r in range(n):
        with open(os.path.join(d, f"pids-{r}")) as f:
            out.extend(int(x) for x in f.read().split())
    return out


def _all_recorded(d, n):
    return all(os.path.exists(os.path.join(d, f"pids-{r}")) for r in range(n))


def test_raising_rank_summary_and_teardown(launcher):
    launcher.script(RECORD_PIDS + """
if os.environ["RANK"] == "1":
    while not all(os.path.exists(os.path.join(d, f"pids-{r}")) for r in range(3)):
        time.sleep(0.01)
    def load_weights(path):
        raise ValueError(f"no checkpoint at {path!r}")
    load_weights("/nope")
time.sleep(120)
""")
    r = launcher.run("--nproc-per-node", 3, "job.py")
    assert r.returncode == 1
    err = r.stderr
    summary = err[err.index("FAILED"):]
    assert "rank       : 1 (local rank 1)" in summary
    assert "exit code 1" in summary
    assert "in load_weights" in summary and "ValueError: no checkpoint at '/nope'" in summary
    assert "_bootstrap" not in summary and 'File "<string>"' not in summary
    assert "host       : " in summary
    # The traceback printed by the rank itself is forwarded, prefixed, without launcher frames.
    assert "[rank1]:ValueError: no checkpoint at '/nope'" in err
    assert "_bootstrap.py" not in err
    # The others (and their children) were stopped: nothing survives the launcher.
    wait_dead(_pids(launcher.cwd, 3), timeout=5)


def test_exit_code_without_exception(launcher):
    launcher.script('import os, sys, time\nif os.environ["RANK"] == "0": sys.exit(3)\ntime.sleep(120)')
    r = launcher.run("--nproc-per-node", 2, "job.py")
    assert r.returncode == 3
    assert "rank       : 0" in r.stderr and "exit code 3" in r.stderr
    assert "without an unhandled Python exception" in r.stderr


def test_rank_killed_by_signal_is_named(launcher):
    launcher.script('import os, signal, time\nif os.environ["RANK"] == "2": os.kill(os.getpid(), signal.SIGKILL)\ntime.sleep(120)')
    r = launcher.run("--nproc-per-node", 3, "job.py")
    assert r.returncode == 128 + 9
    assert "rank       : 2" in r.stderr
    assert "killed by SIGKILL" in r.stderr


def test_rank_ignoring_sigterm_is_killed_after_grace(launcher):
    launcher.script("""
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(f"ready-{os.environ['RANK']}", "w").close()
if os.environ["RANK"] == "0":
    while not os.path.exists("ready-1"):
        time.sleep(0.01)
    sys.exit(5)
time.sleep(120)
""")
    r = launcher.run("--nproc-per-node", 2, "--term-timeout", "0.5", "job.py", timeout=30)
    assert r.returncode == 5
    assert "did not exit within" in r.stderr and "SIGKILL" in r.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_launcher_reaches_every_rank(launcher, sig):
    launcher.script(RECORD_PIDS + """
try:
    time.sleep(120)
except KeyboardInterrupt:
    open(os.path.join(d, f"interrupted-{os.environ['RANK']}"), "w").close()
    raise
""")
    p = launcher.popen("--nproc-per-node", 3, "job.py")
    try:
        wait_for(lambda: _all_recorded(launcher.cwd, 3), 30, "ranks to start")
        pids = _pids(launcher.cwd, 3)
        p.send_signal(sig)
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 128 + sig
    assert f"interrupted by {signal.Signals(sig).name}" in err
    wait_dead(pids, timeout=5)
    if sig == signal.SIGINT:  # forwarded as SIGINT: Python ranks see KeyboardInterrupt
        assert all(os.path.exists(os.path.join(launcher.cwd, f"interrupted-{r}")) for r in range(3))


def test_sigkilled_launcher_takes_its_ranks_along(launcher):
    launcher.script(RECORD_PIDS + "time.sleep(120)\n")
    p = launcher.popen_to_kill("--nproc-per-node", 2, "job.py")
    pids = []
    try:
        wait_for(lambda: _all_recorded(launcher.cwd, 2), 30, "ranks to start")
        pids = _pids(launcher.cwd, 2)
        p.kill()
        p.wait(10)
        wait_dead(pids[0::2], timeout=5)  # the ranks: PR_SET_PDEATHSIG
    finally:
        p.kill()
        # The ranks' own children are not covered when the launcher dies by SIGKILL
        # (docs/launch.md): do not leave them behind.
        for pid in pids[1::2]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_successful_job_leaves_no_stray_processes(launcher):
    # A rank that leaves a background child behind: the launcher kills its process group.
    launcher.script(RECORD_PIDS)
    r = launcher.run("--nproc-per-node", 2, "job.py")
    assert r.returncode == 0, r.stderr
    wait_dead(_pids(launcher.cwd, 2), timeout=5)


def test_max_restarts_restarts_the_group(launcher):
    launcher.script("""
import os, sys
attempt = int(os.environ["NDIST_RESTART_COUNT"])
print("attempt", attempt, "rank", os.environ["RANK"], "max", os.environ["NDIST_MAX_RESTARTS"])
if attempt < 2 and os.environ["RANK"] == "1":
    sys.exit(7)
""")
    r = launcher.run("--nproc-per-node", 2, "--max-restarts", 2, "job.py")
    assert r.returncode == 0, r.stderr
    assert "[rank1]:attempt 2 rank 1 max 2" in r.stdout
    assert r.stderr.count("restarting the worker group") == 2
    r = launcher.run("--nproc-per-node", 2, "--max-restarts", 1, "job.py")
    assert r.returncode == 7
    assert "attempt 2 of 2" in r.stderr and "exit code 7" in r.stderr


def test_two_jobs_at_once_do_not_collide(launcher, tmp_path):
    launcher.script("""
import json, os, time
open(f"ready-{os.environ['NDIST_RUN_ID']}-{os.environ['RANK']}", "w").close()
deadline = time.monotonic() + 30
while len([f for f in os.listdir(".") if f.startswith("ready-")]) < 4 and time.monotonic() < deadline:
    time.sleep(0.01)  # both jobs are running at the same time
keys = ("MASTER_PORT", "NDIST_SECRET", "NDIST_ERROR_FILE")
with open(f"env-{os.environ['NDIST_RUN_ID']}-{os.environ['RANK']}", "w") as f:
    json.dump({k: os.environ[k] for k in keys}, f)
""")
    a = launcher.popen("--nproc-per-node", 2, "--rdzv-id", "A", "--log-dir", "logs", "job.py")
    b = launcher.popen("--nproc-per-node", 2, "--rdzv-id", "B", "--log-dir", "logs", "job.py")
    try:
        assert a.wait(50) == 0 and b.wait(50) == 0, (a.stderr.read(), b.stderr.read())
    finally:
        a.kill()
        b.kill()
    import json

    ea = json.loads((tmp_path / "env-A-0").read_text())
    eb = json.loads((tmp_path / "env-B-0").read_text())
    assert ea["MASTER_PORT"] != eb["MASTER_PORT"]
    assert ea["NDIST_SECRET"] != eb["NDIST_SECRET"]
    assert os.path.dirname(os.path.dirname(os.path.dirname(ea["NDIST_ERROR_FILE"]))) != os.path.dirname(
        os.path.dirname(os.path.dirname(eb["NDIST_ERROR_FILE"])))


def test_root_cause_is_the_earliest_error_not_the_first_exit(launcher):
    # Rank 1 raises first but lingers in an atexit handler; rank 0 raises after it and
    # exits at once. The summary must blame rank 1, whose error is older.
    launcher.script("""
import atexit, os, time
me = os.environ["NDIST_ERROR_FILE"]
if os.environ["RANK"] == "1":
    atexit.register(time.sleep, 30)
    raise RuntimeError("the real cause")
other = me.replace(os.sep + "0" + os.sep, os.sep + "1" + os.sep)
while not os.path.exists(other):
    time.sleep(0.01)
raise ConnectionError("peer went away")
""")
    r = launcher.run("--nproc-per-node", 2, "--term-timeout", 1, "job.py")
    assert r.returncode == 1, r.stderr
    summary = r.stderr[r.stderr.index("FAILED"):]
    assert "rank       : 1 (local rank 1)" in summary and "RuntimeError: the real cause" in summary
    assert "raised, then was stopped by the launcher while exiting (killed by SIGTERM)" in summary
    assert "other failures:\n  rank 0 on " in summary and "exit code 1" in summary


def test_processes_escaping_the_rank_process_group_do_not_survive(launcher):
    # A rank starts a daemon in a new session (outside its process group) and exits:
    # the launcher adopts it as a child subreaper and kills it at the end.
    launcher.script("""
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
with open(f"daemon-{os.environ['RANK']}", "w") as f:
    f.write(str(child.pid))
""")
    r = launcher.run("--nproc-per-node", 2, "job.py")
    assert r.returncode == 0, r.stderr
    pids = [int(open(os.path.join(launcher.cwd, f"daemon-{i}")).read()) for i in range(2)]
    try:
        wait_dead(pids, timeout=5)
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_second_sigint_kills_at_once(launcher):
    # Ranks ignore SIGINT; with a 60 s grace period only the second Ctrl-C can end the job quickly.
    launcher.script(RECORD_PIDS + """
import signal
signal.signal(signal.SIGINT, signal.SIG_IGN)
open(os.path.join(d, f"ignoring-{os.environ['RANK']}"), "w").close()
time.sleep(120)
""")
    p = launcher.popen("--nproc-per-node", 2, "--term-timeout", 60, "job.py")
    try:
        wait_for(lambda: all(os.path.exists(os.path.join(launcher.cwd, f"ignoring-{r}")) for r in range(2)), 30,
                 "ranks to ignore SIGINT")
        pids = _pids(launcher.cwd, 2)
        p.send_signal(signal.SIGINT)
        with pytest.raises(subprocess.TimeoutExpired):
            p.wait(0.5)  # still in its grace period
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=20)
    finally:
        p.kill()
    assert p.returncode == 130
    wait_dead(pids, timeout=5)
