import os
import sys

# The checkout's root is on sys.path (pytest's ``pythonpath`` option, pyproject.toml): the
# tests import their helpers as modules of the ``tests`` package (``from tests.kill_sync
# import all_past``). Child processes (spawn, mpiexec, ndistrun) must import this checkout's
# ndist and the same helpers.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = _ROOT + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")

# ---------------------------------------------------------------- /dev/shm
# The suite must leave /dev/shm as it found it. Other processes on this machine
# (other test runs) create and remove ndist files at the same time, so a file counts
# as this run's only if the process that owns it (the pid in its name) carries this
# run's token in its environment: every process the tests start inherits it. A
# watcher looks at new files while their owners are alive (five times a second).
# A killed job's files may outlive owners the watcher never saw alive (a job killed
# within 0.2 s, or between two looks), so a file counts by its job too: the files of
# a job (``ndist-<job>-...``) one of whose files was this run's, or that a test
# declared its own (the ``shm_job`` fixture: kill tests do), are this run's.
import atexit  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402

import pytest  # noqa: E402

_SHM = "/dev/shm"
_TOKEN_VAR = "NDIST_TEST_SESSION"
# Under pytest-xdist (``-n 2``) each worker is a run of its own: it inherited the controller's
# token, and takes a fresh one (once: what it starts inherits both variables), so that its
# guards count only its own files, never the other worker's live ones.
_WORKER_VAR = "NDIST_TEST_WORKER"
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER and os.environ.get(_WORKER_VAR) != _WORKER:
    os.environ[_TOKEN_VAR] = os.urandom(8).hex()
    os.environ[_WORKER_VAR] = _WORKER
_TOKEN = os.environ.setdefault(_TOKEN_VAR, os.urandom(8).hex())
_OWNER = re.compile(r"-p(\d+)-|^ndist_mp_(\d+)_")
_JOB = re.compile(r"^(ndist-[0-9a-f]{10})-")
#: job prefixes (``ndist-<job>``) whose files are this run's
_OUR_JOBS: set = set()


def _job(name: str):
    m = _JOB.match(name)
    return m.group(1) if m else None


class _ShmWatch(threading.Thread):
    def __init__(self) -> None:
        super().__init__(name="shm-watch", daemon=True)
        self.seen: set = set()
        self.ours: set = set()
        self.orphans: set = set()  # seen with their owner gone: this run's if their job is
        self.before: set = set()  # there when the run began
        self.stop = threading.Event()
        self._mark = f"{_TOKEN_VAR}={_TOKEN}".encode()

    def scan(self) -> None:
        try:
            names = os.listdir(_SHM)
        except OSError:
            return
        for name in names:
            if name in self.seen or not name.startswith("ndist"):
                continue
            self.seen.add(name)
            m = _OWNER.search(name)
            if m is None:
                continue
            pid = int(m.group(1) or m.group(2))
            if pid == os.getpid():  # (this process's own environ block predates the token)
                self._ours(name)
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                self.orphans.add(name)
                continue
            if self._mark in env:
                self._ours(name)

    def _ours(self, name: str) -> None:
        self.ours.add(name)
        if _job(name) is not None:
            _OUR_JOBS.add(_job(name))

    def all_ours(self) -> set:
        """This run's files: attributed by owner, or by job (see above)."""
        try:
            now = set(os.listdir(_SHM))
        except OSError:
            now = set()
        by_job = {n for n in (self.orphans | now) - self.before if _job(n) in _OUR_JOBS}
        return self.ours | by_job

    def run(self) -> None:
        while not self.stop.wait(0.2):
            self.scan()


@pytest.fixture(scope="session", autouse=True)
def _leaves_dev_shm_as_found():
    if not os.path.isdir(_SHM):
        yield
        return
    before = set(os.listdir(_SHM))
    watch = _ShmWatch()
    watch.seen |= before
    watch.before = before
    watch.start()
    yield
    watch.stop.set()
    watch.join(5)
    watch.scan()
    leaked = sorted(n for n in watch.all_ours() if os.path.exists(os.path.join(_SHM, n)))
    for n in leaked:
        try:
            os.unlink(os.path.join(_SHM, n))
        except OSError:
            pass
    # MPICH's segments of the MPI jobs the tests ran: one no process maps any more was left
    # by a job killed or aborted before MPI_Finalize
    from ndist.bench._launch import remove_orphan_mpich_segments

    leaked += remove_orphan_mpich_segments(before)
    if leaked:
        pytest.fail(f"the tests left {len(leaked)} file(s) of their own in {_SHM} (now removed): {leaked[:20]}",
                    pytrace=False)


# ---------------------------------------------------------------- temporary files
# The suite must leave no temporary file behind either. Every process the tests start makes
# its temporary files (``tempfile``, and whatever reads TMPDIR: ndistrun's job folders,
# spawn's error files, torchrun's logs) under one folder of this run, inherited through
# TMPDIR, so whatever appears there is this run's: each test is checked when it ends, and the
# folder is removed with the session. Not counted: pytest's ``tmp_path`` folders
# (``pytest-of-<user>``, pytest's to keep), multiprocessing's ``pymp-*`` (one per process
# that uses it, removed when that process exits), torch's compile cache (a folder of this
# run) and the torch suite driver's folder (removed at exit, after multiprocessing's clean-up:
# tests/torch_suite/torch_suite.py). A pytest started under this run (an MPI job's, tests/mpi_backend/test_mpi_suite.py; a tool's)
# keeps the TMPDIR it was given: its files are the test's that started it. Each xdist worker
# (a token of its own) makes its own folder beside the controller's, not inside it: the
# paths of Unix sockets made under it (multiprocessing's, in the torch suite driver's folder)
# must stay within 107 bytes.
_TMP_VAR = "NDIST_TEST_TMP"
_TMP_BASE_VAR = "NDIST_TEST_TMP_BASE"  # where each run makes its folder: the TMPDIR the first found
_TMP_ROOT = None
if not os.environ.get(_TMP_VAR, "").startswith(_TOKEN + ":"):
    _TMP_ROOT = tempfile.mkdtemp(prefix=f"ndist-tests-{_TOKEN[:8]}-",
                                 dir=os.environ.setdefault(_TMP_BASE_VAR, tempfile.gettempdir()))
    os.environ[_TMP_VAR] = f"{_TOKEN}:{_TMP_ROOT}"
    os.environ["TMPDIR"] = _TMP_ROOT
    tempfile.tempdir = None  # (gettempdir() reads TMPDIR again)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_TMP_ROOT, "torch-compile-cache"))
    # ndist's compiled torch backend: built once per run, shared by the xdist workers
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(_TMP_ROOT, "torch-extensions"))
    _TMP_OWNER = os.getpid()

    @atexit.register
    def _remove_the_temporary_folder_at_exit() -> None:
        if os.getpid() == _TMP_OWNER:  # (not in a forked child that runs atexit handlers)
            shutil.rmtree(_TMP_ROOT, ignore_errors=True)

_NOT_COUNTED = ("pytest-of-", "pymp-", "torch-compile-cache", "torch-extensions", "ndist-torch-suite-")


def _tmp_entries() -> set:
    if _TMP_ROOT is None:
        return set()
    try:
        return {n for n in os.listdir(_TMP_ROOT) if not n.startswith(_NOT_COUNTED)}
    except OSError:
        return set()


def _fail_if_left(left: list, who: str) -> None:
    """Remove what ``who`` (the test, the tests) left in the run's TMPDIR, then fail naming it."""
    if not left:
        return
    for n in left:
        path = os.path.join(_TMP_ROOT, n)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass
    pytest.fail(f"{who} left {len(left)} temporary file(s) in TMPDIR (now removed): {left[:20]}", pytrace=False)


@pytest.fixture(autouse=True)
def _leaves_no_temporary_file():
    before = _tmp_entries()
    yield
    _fail_if_left(sorted(_tmp_entries() - before), "the test")


@pytest.fixture(scope="session", autouse=True)
def _leaves_the_temporary_folder_empty():
    yield
    _fail_if_left(sorted(_tmp_entries()), "the tests")


@pytest.fixture
def shm_job():
    """``shm_job(prefix)``: the files of job ``prefix`` (``ndist-<job>``, ``_shmfiles.job_prefix``)
    are this run's, for the /dev/shm guard, whether or not their owners were seen alive."""
    def declare(prefix: str) -> None:
        _OUR_JOBS.add(_job(prefix + "-") or prefix)
    return declare


# ---------------------------------------------------------------- MPI-job tests
# Tests marked ``mpi`` run inside an MPI job: ``mpiexec -n N python -m pytest --with-mpi -m
# mpi ...``, which tests/mpi_backend/test_mpi_suite.py launches from the plain run. The plain run leaves
# them out (deselected, not skipped: they do run, under mpiexec).
def _with_mpi(config) -> bool:
    try:
        return bool(config.getoption("--with-mpi"))
    except ValueError:  # pytest-mpi not installed
        return False


def pytest_collection_modifyitems(config, items):
    if _with_mpi(config):
        return
    keep, dropped = [], []
    for item in items:
        (dropped if item.get_closest_marker("mpi") is not None else keep).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture(scope="session")
def comm():
    """MPI.COMM_WORLD, for tests marked ``mpi`` (mpi4py is imported only here)."""
    from mpi4py import MPI

    return MPI.COMM_WORLD


# ---------------------------------------------------------------- torch's compiled backend
# Backend "ndist" uses its compiled backend unless $NDIST_TORCH_COMPILED=0 switches it off
# (ndist/torch/_compiled.py). It is built once per run into the run's TORCH_EXTENSIONS_DIR (a
# minute or two on 2 cores) before the first test marked ``torch`` (unless the run sets
# NDIST_TORCH_COMPILED=0), so no rank process compiles it within a test's timeout.
_BUILD = """
import logging, os, sys
logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
from ndist.torch import _compiled
name = _compiled._name()
print("EXISTED", os.path.exists(os.path.join(_compiled.build_directory(name), name + ".so")), flush=True)
import ndist.torch.ops as ops
print("LOADED", ops.load())
"""


@pytest.fixture(scope="session")
def torch_compiled_build():
    """Build ndist's compiled torch backend (or load the run's): ``(no_cache_yet, log)``,
    ``no_cache_yet`` whether this process found no cached module when it started (another
    pytest worker may then build it first, under the build's lock). Skips where there is no
    C++ compiler."""
    pytest.importorskip("torch")
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler: ndist's compiled torch backend cannot be built")
    import subprocess

    out = subprocess.run([sys.executable, "-c", _BUILD], capture_output=True, text=True, timeout=900,
                         env=dict(os.environ, NDIST_TORCH_COMPILED="1"))
    log = out.stdout + out.stderr
    if out.returncode != 0 or "LOADED True" not in log:
        pytest.fail(f"ndist's compiled torch backend did not build:\n{log[-5000:]}", pytrace=False)
    return "EXISTED False" in log, log


@pytest.fixture(scope="session", autouse=True)
def _torch_compiled_built_first(request):
    """Runs the build before the first torch test of a session that has any (unless the
    compiled backend is switched off); the test itself fails if it does not build."""
    if os.environ.get("NDIST_TORCH_COMPILED", "auto").strip() == "0":  # (unset: auto, ndist/torch/_compiled.py)
        return
    if not any(item.get_closest_marker("torch") is not None for item in request.session.items):
        return
    try:
        request.getfixturevalue("torch_compiled_build")
    except (pytest.skip.Exception, pytest.fail.Exception):
        pass  # no compiler or a failed build: the Python backend serves (and the compiled tests say why)


# ---------------------------------------------------------------- scheduling under -n
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``-n N`` (``--dist load``): the tests of one cached launch on one worker
    (tests/launch_scheduling.py); any other ``--dist`` is xdist's own."""
    if config.getvalue("dist") != "load":
        return None
    from tests.launch_scheduling import LaunchScheduling

    return LaunchScheduling(config, log)
