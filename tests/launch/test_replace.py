"""--on-failure replace / --max-restarts N: a lost rank's place is taken by a new process on its
node, while the others run on; the summary lists each loss and each replacement, and a rank
replaced --max-restarts times is lost as with continue.

The ranks here do not join groups (the launcher's side only); the heal itself (grow_group) is
tested in tests/runtime/test_grow.py and tests/launch/test_heal.py."""

import os

import pytest

pytestmark = pytest.mark.timeout(90)

# rank VICTIM SIGKILLs itself (the first process, or every one with ALWAYS=1) once it runs,
# noting its pid in victims.txt first; the others wait for VICTIMS such notes when it is set (the
# victim's processes come and go at the launcher's pace, which a loaded machine slows), then sleep
# SURVIVE s; every process that lives prints its rank and the replacement variables
JOB = """
import os, signal, time
rank = int(os.environ["RANK"])
rep = os.environ.get("NDIST_REPLACEMENT")
if rank == int(os.environ["VICTIM"]) and (rep is None or os.environ.get("ALWAYS")):
    time.sleep(0.2)
    with open("victims.txt", "a") as f:
        f.write(f"{os.getpid()}\\n")
    os.kill(os.getpid(), signal.SIGKILL)
if os.environ.get("VICTIMS"):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if os.path.exists("victims.txt") and len(open("victims.txt").read().split()) >= int(os.environ["VICTIMS"]):
            break
        time.sleep(0.05)
time.sleep(float(os.environ["SURVIVE"]))
print("done", rank, os.getpid(), os.environ.get("NDIST_REPLACES"), rep)
"""


def _env(victim, survive, **extra):
    return {**os.environ, "VICTIM": str(victim), "SURVIVE": str(survive), **extra}


def _summary(err):
    return err[err.index("=" * 72):]


def test_a_lost_rank_is_replaced_on_its_node_while_the_others_run_on(launcher):
    launcher.script(JOB)
    r = launcher.run("--nproc-per-node", 3, "--on-failure", "replace", "job.py", env=_env(1, 1.5))
    assert r.returncode == 0, r.stderr
    lines = sorted(r.stdout.splitlines())
    assert [ln.split()[0] + " " + ln.split()[1] for ln in lines] == ["[rank0]:done 0", "[rank1]:done 1", "[rank2]:done 2"]
    for ln in lines:
        rank = ln.split()[1]
        # the replacement is told which rank it replaces, and that it is the first replacement
        assert ln.split()[3:] == (["1", "1"] if rank == "1" else ["None", "None"]), lines
    new_pid = int(next(ln for ln in lines if ln.startswith("[rank1]")).split()[2])
    s = _summary(r.stderr)
    assert "ndistrun: job.py finished; 1 lost process was replaced (--on-failure replace)" in s
    assert "3 of 3 ranks finished with status 0 (--min-nproc 1): exit status 0" in s
    assert f"replaced rank 1 (replacement 1 of --max-restarts 3, pid {new_pid}); the lost process:" in s
    assert "exit       : killed by SIGKILL (exit status 137)" in s
    assert "starting a replacement (1 of --max-restarts 3)" in r.stderr  # said when it happened


def test_max_restarts_exhausted_the_rank_is_lost_as_with_continue(launcher):
    launcher.script(JOB)
    # (the survivors live until the third of rank 2's processes has died, then 2 s more)
    r = launcher.run("--nproc-per-node", 3, "--on-failure", "replace", "--max-restarts", 2, "job.py",
                     env=_env(2, 2, ALWAYS="1", VICTIMS="3"), timeout=80)
    assert r.returncode == 0, r.stderr
    assert sorted(ln.split()[0] for ln in r.stdout.splitlines()) == ["[rank0]:done", "[rank1]:done"]
    s = _summary(r.stderr)
    assert "finished without 1 lost rank (--on-failure replace)" in s
    assert "2 of 3 ranks finished with status 0 (--min-nproc 1): exit status 0" in s
    assert s.count("replaced rank 2 (replacement ") == 2
    assert "replacement 2 of --max-restarts 2" in s
    assert "lost rank 2 (the job continued without it; replaced 2 time(s) already, --max-restarts 2):" in s
    assert "rank 2 is not replaced again: it was replaced 2 time(s) already (--max-restarts 2)" in r.stderr


def test_max_restarts_exhausted_below_min_nproc_stops_the_job(launcher):
    launcher.script(JOB)
    r = launcher.run("--nproc-per-node", 2, "--on-failure", "replace", "--max-restarts", 1, "--min-nproc", 2,
                     "job.py", env=_env(0, 30, ALWAYS="1"), timeout=60)
    assert r.returncode == 137, r.stderr
    s = _summary(r.stderr)
    assert "FAILED (attempt 1 of 1; --on-failure replace)" in s
    assert "replaced rank 0 (replacement 1 of --max-restarts 1" in s


@pytest.mark.parametrize("bad,why", [
    (("--on-failure", "heal"), "--on-failure: expected 'stop', 'continue' or 'replace', got 'heal'"),
    (("--on-failure", "replace", "--max-restarts", "-1"), "--max-restarts: expected an integer >= 0, got -1"),
])
def test_bad_options_are_refused(launcher, bad, why):
    launcher.script(JOB)
    r = launcher.run("--nproc-per-node", 2, *bad, "job.py", env=_env(0, 0))
    assert r.returncode == 2 and why in r.stderr, r.stderr
