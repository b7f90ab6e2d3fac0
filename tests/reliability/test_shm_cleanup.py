"""No file of a job is left in /dev/shm, whatever ends its ranks (issue 14, item 5).

The ranks here are plain processes (not ``run_ranks``, whose own clean-up would
hide theirs) or ranks of ``ndistrun``; each test counts the files of its job,
found by the job secret's prefix, after the ranks are gone."""

import glob
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from ndist.runtime._shmfiles import SHM_DIR, job_prefix
from ndist.runtime.store import TCPStoreServer
from ndist.testing import run_ranks
from tests.launch.launch_helpers import alive
from tests.tmp_folders import tmp_under

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason="no /dev/shm")]

_RANK = """
import glob, os, signal, sys, time
from datetime import timedelta
import numpy as np
import ndist.distributed as dist
from ndist.runtime._shmfiles import SHM_DIR, job_prefix

mode, out = sys.argv[1], sys.argv[2]
dist.init_process_group("socket", timeout=timedelta(seconds=30))
rank = dist.get_rank()
for _ in range(3):
    x = np.ones(1 << 16)  # 512 KiB: payloads through the shared-memory segments
    dist.all_reduce(x)
    dist.all_reduce(np.ones(4))  # small frames: through the rings
# this job does have shared-memory files now, nameless or not (else the test could not fail)
from ndist.runtime._shmfiles import held
job = job_prefix(os.environ["NDIST_SECRET"])
n = len(set(held(job)) | {os.path.basename(p) for p in glob.glob(os.path.join(SHM_DIR, job + "*"))})
with open(os.path.join(out, f"count{rank}"), "w") as f:
    f.write(str(n))
dist.barrier()
if mode == "exception":
    raise RuntimeError("boom")
if mode == "sigkill":
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        dist.all_reduce(np.ones(4))
    except dist.DistError as err:
        print("survivor", rank, type(err).__name__, flush=True)
if mode == "sigterm":
    open(os.path.join(out, f"ready{rank}"), "w").close()
    time.sleep(60)
# normal end (and the survivors of sigkill): no destroy_process_group()
"""


def _job_files(secret: str) -> list:
    return sorted(glob.glob(os.path.join(SHM_DIR, job_prefix(secret) + "*")))


def _run_plain_ranks(tmp_path, mode: str, n: int, secret: str, on_start=None):
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(_RANK))
    server = TCPStoreServer("127.0.0.1", 0, secret)
    procs = []
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "OMPI_", "SLURM_"))}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(server.port), NDIST_STORE=f"127.0.0.1:{server.port}",
                   NDIST_SECRET=secret, WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n), NDIST_TRANSPORT="auto")
        for r in range(n):
            procs.append(subprocess.Popen([sys.executable, str(script), mode, str(tmp_path)],
                                          env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), start_new_session=True))
        if on_start is not None:
            on_start(procs)
        codes = [p.wait(timeout=90) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        server.close()
    counts = [int((tmp_path / f"count{r}").read_text()) for r in range(n) if (tmp_path / f"count{r}").exists()]
    return codes, counts


def _wait_files(tmp_path, names, timeout=60, written=False):
    """``written``: non-empty too (a rank creates the file, then writes it: read in between,
    it is empty)."""
    deadline = time.monotonic() + timeout
    while not all((tmp_path / n).exists() and (not written or (tmp_path / n).stat().st_size > 0) for n in names):
        assert time.monotonic() < deadline, f"ranks did not get ready: {names}"
        time.sleep(0.05)


@pytest.mark.parametrize("mode", ["normal", "exception", "sigkill", "sigterm"])
def test_no_job_file_left_when_ranks_end_without_destroy(tmp_path, mode):
    secret = uuid.uuid4().hex
    n = 3

    def sigterm_all(procs):
        if mode == "sigterm":
            _wait_files(tmp_path, [f"ready{r}" for r in range(n)])
            for p in procs:
                p.send_signal(signal.SIGTERM)

    try:
        codes, counts = _run_plain_ranks(tmp_path, mode, n, secret, sigterm_all)
        assert len(counts) == n and all(c >= 2 for c in counts), counts  # segments and rings existed
        want = {"normal": [0, 0, 0], "exception": [1, 1, 1], "sigkill": [0, -signal.SIGKILL, 0],
                "sigterm": [-signal.SIGTERM] * 3}[mode]
        assert codes == want, codes  # (SIGTERM still ends a rank by that signal)
        assert _job_files(secret) == []
    finally:
        for path in _job_files(secret):
            os.unlink(path)


# the start of the launched jobs below: segments and rings made and used
_WARM = """
import os, signal, sys, time
from datetime import timedelta
import numpy as np
import ndist.distributed as dist

dist.init_process_group("socket", timeout=timedelta(seconds=30))
rank = dist.get_rank()
for _ in range(3):
    dist.all_reduce(np.ones(1 << 16))
    dist.all_reduce(np.ones(4))
"""

def _no_job_files(secret) -> None:
    """No file of the job of ``secret`` is left (those left are removed)."""
    leftovers = _job_files(secret)
    for path in leftovers:
        os.unlink(path)
    assert leftovers == []


_LAUNCHED = _WARM + """with open(f"secret{rank}", "w") as f:
    f.write(os.environ["NDIST_SECRET"])
dist.barrier()
if rank == 1:
    time.sleep(0.5)
    if sys.argv[2] == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError("rank 1 fails; the launcher tears the others down")
if sys.argv[1] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only the launcher's SIGKILL ends it
time.sleep(60)
"""


@pytest.mark.parametrize("failure", ["raise", "sigkill"])
@pytest.mark.parametrize("sigterm", ["default", "ignore"])
def test_launcher_removes_the_job_files_after_a_teardown(tmp_path, sigterm, failure):
    (tmp_path / "job.py").write_text(textwrap.dedent(_LAUNCHED))
    r = subprocess.run([sys.executable, "-m", "ndist.launch", "--nproc-per-node", "3", "--term-timeout", "1",
                        "job.py", sigterm, failure], cwd=tmp_path, capture_output=True, text=True, timeout=90)
    assert r.returncode == (1 if failure == "raise" else 128 + signal.SIGKILL), r.stderr
    secret = (tmp_path / "secret0").read_text()
    _no_job_files(secret)


def _sweep_on_init(rank, size):
    import ndist.distributed as dist
    from ndist.runtime import _net

    secret = _net.job_secret()
    p = subprocess.Popen(["true"])
    p.wait()  # a pid that is gone
    names = [f"{job_prefix(secret, 'old')}-r{rank}-p{p.pid}-i0-ring",
             f"{job_prefix(secret, 'old')}-r{rank}-p{p.pid}-i0-g1"]
    for n in names:
        open(os.path.join(SHM_DIR, n), "wb").close()
    dist.init_process_group("socket")
    dist.barrier()  # the backend starts on first use
    left = [n for n in names if os.path.exists(os.path.join(SHM_DIR, n))]
    dist.destroy_process_group()
    for n in left:
        os.unlink(os.path.join(SHM_DIR, n))
    return left


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_init_sweeps_rings_and_segments_of_dead_owners(transport):
    assert run_ranks(_sweep_on_init, 2, init=False, transport=transport, timeout=60) == [[], []]


_WAITING = _WARM + """if rank == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only the launcher's SIGKILL ends it
from ndist.runtime._shmfiles import held, job_prefix
with open(f"files{rank}", "w") as f:
    f.write(str(len(held(job_prefix(os.environ["NDIST_SECRET"])))))
with open(f"secret{rank}", "w") as f:
    f.write(os.environ["NDIST_SECRET"])
time.sleep(60)
"""


def test_a_launcher_stopped_by_sigterm_removes_the_job_files(tmp_path):
    (tmp_path / "job.py").write_text(textwrap.dedent(_WAITING))
    proc = subprocess.Popen([sys.executable, "-m", "ndist.launch", "--nproc-per-node", "2", "--term-timeout", "1",
                             "job.py"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_files(tmp_path, ["secret0", "secret1"], written=True)
        secret = (tmp_path / "secret0").read_text()
        files = [int((tmp_path / f"files{r}").read_text()) for r in range(2)]
        assert all(files), f"the job made no files: this test could not fail ({files})"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, err
    _no_job_files(secret)


# ---------------------------------------------------------------- killed jobs (issue 29, item 7)
# Nothing may stay in /dev/shm when a job is killed, whatever kills it: SIGKILL reaches
# ranks before any clean-up of theirs can run, so the files must already have no name
# while the ranks use them (``_shmfiles.create_unlinked``). Each rank reports the job's
# shared-memory files it has (unlinked ones it holds open, plus any named ones), so a
# job that used no shared memory fails the test instead of passing it.
_BUSY = """
import glob, os, sys
from datetime import timedelta
import numpy as np
import ndist.distributed as dist
from ndist.runtime import _net, _shmfiles

dist.init_process_group("socket", timeout=timedelta(seconds=60))
rank = dist.get_rank()
job = _shmfiles.job_prefix(_net.job_secret())
x = np.ones(1 << 16)  # 512 KiB: the segments (Python engine) or the native slots
for _ in range(3):
    dist.all_reduce(x)
    dist.all_reduce(np.ones(4))  # small frames: the rings (Python engine)
names = set(_shmfiles.held(job)) | {os.path.basename(p) for p in
                                   glob.glob(os.path.join(_shmfiles.SHM_DIR, glob.escape(job) + "*"))}
with open(f"job{rank}.tmp", "w") as f:
    f.write(f"{job} {os.getpid()} {len(names)} {dist.get_engine()}")
os.rename(f"job{rank}.tmp", f"job{rank}")
while True:  # collectives over shared memory until killed
    dist.all_reduce(x)
    dist.all_reduce(np.ones(4))
"""


def _reports(tmp_path, n: int, timeout: float = 90):
    _wait_files(tmp_path, [f"job{r}" for r in range(n)], timeout=timeout, written=True)
    out = []
    for r in range(n):
        job, pid, files, engine = (tmp_path / f"job{r}").read_text().split()
        out.append((job, int(pid), int(files), engine))
    return out


def _end(proc, pids) -> None:
    """The killed job's launcher ``proc`` (its own session) and its ranks ``pids`` are gone."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    _wait_gone(pids, 5)
    proc.stderr.close()


def _wait_gone(pids, timeout: float = 30) -> list:
    """The pids still alive after ``timeout`` (killed then, so the test leaves none)."""
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in pids if alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    return left


def _left(job: str) -> list:
    """The job's files left in /dev/shm (removed now: the test leaves none behind)."""
    left = sorted(glob.glob(os.path.join(SHM_DIR, glob.escape(job) + "*")))
    for path in left:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    return [os.path.basename(p) for p in left]


def _kill_env(engine: str, tmp_path) -> dict:
    """The environment of a launcher the test SIGKILLs: it cannot remove its job folder then,
    so its TMPDIR is a folder of the test's (pytest's ``tmp_path``), not the run's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "OMPI_", "SLURM_", "TORCHELASTIC_"))}
    env.update(NDIST_ENGINE=engine, NDIST_TRANSPORT="shm", TMPDIR=tmp_under(tmp_path, "killed-tmp"))
    env.pop("NDIST_SECRET", None)
    return env


@pytest.mark.parametrize("engine", ["python", "native"])
@pytest.mark.parametrize("kill", ["launcher", "process-group"])
def test_no_job_file_left_when_a_launched_job_is_killed(tmp_path, engine, kill, shm_job):
    """``kill -9`` of ``ndistrun`` alone (its ranks die with it) or of its whole process
    group, while 2 ranks run collectives over shared memory (segments and rings on the
    Python engine, the native slots on the native one): once the ranks are gone, no file
    of the job is in /dev/shm."""
    (tmp_path / "job.py").write_text(textwrap.dedent(_BUSY))
    proc = subprocess.Popen([sys.executable, "-m", "ndist.launch", "--nproc-per-node", "2", "job.py"], cwd=tmp_path,
                            env=_kill_env(engine, tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    pids, job = [], None
    try:
        reports = _reports(tmp_path, 2)
        job, pids = reports[0][0], [r[1] for r in reports]
        shm_job(job)
        assert all(r[0] == job for r in reports), reports
        assert [r[3] for r in reports] == [engine] * 2, reports
        assert all(r[2] >= 2 for r in reports), reports  # the job has shared-memory files: the test can fail
        if kill == "launcher":
            proc.kill()
        else:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert _wait_gone(pids) == [], "the ranks outlived their killed launcher"
    finally:
        _end(proc, pids)
    assert _left(job) == []


_TORCH_STUCK = """
import glob, os, signal, time
import torch
import torch.distributed as dist
import ndist.torch  # noqa: F401 - registers backend "ndist"
from ndist.runtime import _net, _shmfiles

dist.init_process_group("ndist")
rank = dist.get_rank()
job = _shmfiles.job_prefix(_net.job_secret())
for _ in range(3):
    dist.all_reduce(torch.ones(1 << 16))
    dist.all_reduce(torch.ones(4))
names = set(_shmfiles.held(job)) | {os.path.basename(p) for p in
                                   glob.glob(os.path.join(_shmfiles.SHM_DIR, glob.escape(job) + "*"))}
files = len(names)
engine = "native" if any(n.endswith("-nat") for n in names) else "python"  # (the native slots)
with open(f"job{rank}.tmp", "w") as f:
    f.write(f"{job} {os.getpid()} {files} {engine}")
os.rename(f"job{rank}.tmp", f"job{rank}")
# a program's own SIGTERM handler (e.g. "checkpoint at the next step"): the stuck ranks
# outlive torchrun's SIGTERM and are SIGKILLed at the end of its grace period
signal.signal(signal.SIGTERM, lambda *args: None)
if rank == 1:
    while True:
        time.sleep(300)  # rank 0 waits for it in the collective below
dist.all_reduce(torch.ones(1 << 16))
"""


@pytest.mark.torch
@pytest.mark.timeout(180)
@pytest.mark.parametrize("engine", ["python", "native"])
def test_no_job_file_left_when_torchrun_stops_stuck_ranks(tmp_path, engine, shm_job):
    """A torch job on backend "ndist" under torchrun, stopped (SIGTERM to torchrun) while
    rank 0 is stuck in a collective that rank 1 (asleep) never joins: no file of the
    job is left in /dev/shm once the ranks are gone. The program handles SIGTERM, so
    the ranks die of the SIGKILL that follows at the end of torchrun's grace period
    (``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, 2 s here): no clean-up of theirs can run."""
    pytest.importorskip("torch")
    (tmp_path / "job.py").write_text(textwrap.dedent(_TORCH_STUCK))
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             "job.py"], cwd=tmp_path, env=dict(_kill_env(engine, tmp_path), TORCH_ELASTIC_SHUTDOWN_TIMEOUT="2"),
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    pids, job = [], None
    try:
        reports = _reports(tmp_path, 2, timeout=120)
        job, pids = reports[0][0], [r[1] for r in reports]
        shm_job(job)
        assert [r[3] for r in reports] == [engine] * 2, reports
        assert all(r[2] >= 2 for r in reports), reports
        time.sleep(0.5)  # rank 0 is in its collective
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=90)
        assert _wait_gone(pids) == []
    finally:
        _end(proc, pids)
    assert _left(job) == []


_NAMES = """
import ctypes, os
from ndist.runtime import _shmfiles

def made(name):
    fd = _shmfiles.create_unlinked(name)
    named = os.path.exists(os.path.join(_shmfiles.SHM_DIR, name))
    return fd, named

first = f"ndist-test-p{os.getpid()}-a"
fd1, named1 = made(first)
other = os.fork()
if other == 0:  # a peer maps it by the owner's descriptor
    fd = _shmfiles.open_shared(first, os.getppid())
    os._exit(0 if os.fstat(fd).st_ino == os.fstat(fd1).st_ino else 1)
_, status = os.waitpid(other, 0)
ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: peers may not open our fds
second = f"ndist-test-p{os.getpid()}-b"
fd2, named2 = made(second)
_shmfiles.release(second, fd2)
_shmfiles.release(first, fd1)
print(named1, status, named2, os.path.exists(os.path.join(_shmfiles.SHM_DIR, second)))
"""


def test_files_have_no_name_unless_peers_may_not_open_the_owner():
    """``create_unlinked``: nameless, reached through the owner's descriptor; where peers may
    not open it (a non-dumpable owner), the file keeps its name until ``release``."""
    r = subprocess.run([sys.executable, "-c", _NAMES], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "0", "True", "False"], r.stdout + r.stderr
