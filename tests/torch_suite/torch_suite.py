"""torch's own distributed test suite (``DistributedTest._DistTestBase``, shipped in the torch
wheel as ``torch/testing/_internal/distributed/distributed_test.py``) on backend ``$BACKEND``
(default ``ndist``) at ``$WORLD_SIZE`` ranks (default 2).

Our counterpart of torch's ``test/distributed/test_distributed_spawn.py``, which is not in the
wheel: the same class, ``TestDistBackend`` (which spawns ``WORLD_SIZE`` processes per test and
joins a group through a ``file://`` store in a fresh temporary folder) with the suite's tests
mixed in. pytest runs it as a unittest class, so the run reports passed/failed/skipped per
test. The file name does not start with ``test_``: the plain run and ``pytest -m torch`` leave
it out, and .ci/run names it in a step of its own::

    python -m pytest -q tests/torch_suite/torch_suite.py            # BACKEND=ndist
    BACKEND=gloo python -m pytest -q tests/torch_suite/torch_suite.py

Every child comes from a fork server that imported this module by name (its preload) and
unpickles ``TestDistBackendWithSpawn._run`` from it: the ``import ndist.torch`` below is what
registers backend ``"ndist"`` in each child. The server is a fresh interpreter that finds the
module through ``PYTHONPATH``, set below (Python 3.11's fork server ignores the parent's
``sys.path``, and a preload it cannot import is skipped without a word: every child then
imported torch and the suite itself, ~5 of the ~6 s each test took on CI), and a child that
finds it imported this module itself fails. The suite skips 26 tests unless the backend is
named gloo or nccl; tests/torch_backend/test_torch_gated.py runs those scenarios on ndist.
"""

from __future__ import annotations

import atexit
import multiprocessing.connection
import multiprocessing.util
import os
import shutil
import tempfile
import time

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

# distributed_test.py reads BACKEND (and the tests WORLD_SIZE, TEMP_DIR, INIT_METHOD) from the
# environment when it is imported; the children inherit it from this process.
os.environ.setdefault("BACKEND", "ndist")
os.environ.setdefault("WORLD_SIZE", "2")

# Everything the suite and its children create with ``tempfile`` (the per-test store file, the
# TEMP_DIR of barrier files and INIT_METHOD's file) lands in one folder of this run, removed at
# the end (the fixture below), so the run leaves no temporary file behind. (The children import
# this module too: they find the folder in the environment.)
_RUN_DIR = os.environ.get("NDIST_TORCH_SUITE_DIR") or tempfile.mkdtemp(prefix="ndist-torch-suite-")
os.environ["NDIST_TORCH_SUITE_DIR"] = os.environ["TMPDIR"] = _RUN_DIR
tempfile.tempdir = None  # (gettempdir() reads TMPDIR again)
os.environ.setdefault("TEMP_DIR", _RUN_DIR)
os.environ.setdefault("INIT_METHOD", f"file://{os.path.join(_RUN_DIR, 'init_file')}")

# the fork server's preload finds this module by name (see above); a child checks that it did
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = _HERE + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
#: the process that imported this module: the fork server, in a child it forked
_IMPORTED_BY = os.getpid()

import ndist.torch  # noqa: E402,F401 - registers backend "ndist" (in this process and every child)
from torch.testing._internal import common_distributed  # noqa: E402
from torch.testing._internal.distributed import distributed_test  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

#: how often the waits of the suite's harness look again (torch's: every 0.1 s)
POLL_S = 0.002


class _QuickPolls:
    """``distributed_test``'s ``time`` while its file barrier (``Barrier.sync``) waits: the
    same clock, and its 0.1 s sleep between looks at the barrier files cut to ``POLL_S``.
    Every child passes that barrier twice per test, the suite's skipped tests included (it
    comes before the skip): two sleeps of 0.1 s were most of what a test took."""

    def __getattr__(self, name):
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(min(seconds, POLL_S))


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """As upstream's driver (each test starts ``WORLD_SIZE`` processes), but the processes
    come from a fork server that imported torch, the suite and ndist.torch once (this module
    is its preload), not from a fresh interpreter each: on CI's 2 cores the imports of two
    children per test cost more than most tests. A forked child inherits the server's
    environment, not this process's, so each gets the environment the test set up
    (``TEMP_DIR``, ``INIT_METHOD``) as an argument, as a spawned child would have it."""

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _barrier(self, *args, **kwargs):
        """torch's file barrier (``Barrier.sync``: its files, ids, lock and timeout), looking
        every ``POLL_S`` (``_QuickPolls``)."""
        distributed_test.time = _QuickPolls()
        try:
            distributed_test.Barrier.sync(*args, **kwargs)
        finally:
            distributed_test.time = time

    def _join_processes(self, fn) -> None:
        """torch's join looks at the children every 0.1 s; wait here for each to exit (or one
        to fail, or torch's timeout for the test) first, so that torch's join, which then
        checks and reports their exit codes, finds them ended at its first look."""
        deadline = time.monotonic() + common_distributed.get_timeout(self.id())
        waiting = {p.sentinel: p for p in self.processes}
        while waiting and time.monotonic() < deadline:
            for sentinel in multiprocessing.connection.wait(list(waiting), deadline - time.monotonic()):
                if waiting.pop(sentinel).exitcode == self.TEST_ERROR_EXIT_CODE:
                    waiting.clear()  # torch's join ends the others
                    break
        super()._join_processes(fn)

    def _spawn_processes(self) -> None:
        ctx = torch.multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])
        self._start_processes(ctx.Process)

    def _start_processes(self, proc) -> None:  # MultiProcessTestCase's, plus the environment
        self.processes = []
        for rank in range(int(self.world_size)):
            parent_conn, child_conn = torch.multiprocessing.Pipe()
            process = proc(target=self.__class__._run, name=f"process {rank}",
                           args=(rank, self._current_test_name(), self.file_name, child_conn),
                           kwargs={"fake_pg": getattr(self, "fake_pg", False), "environ": dict(os.environ)})
            process.start()
            self.pid_to_pipe[process.pid] = parent_conn
            self.processes.append(process)

    @classmethod
    def _run(cls, rank, test_name, file_name, pipe, environ=None, **kwargs):
        if _IMPORTED_BY == os.getpid():
            raise RuntimeError(f"the fork server did not preload {__name__} (PYTHONPATH "
                               f"{os.environ.get('PYTHONPATH')!r}): this child imported torch and the suite itself")
        if environ is not None:
            os.environ.clear()
            os.environ.update(environ)
        try:
            super()._run(rank, test_name, file_name, pipe, **kwargs)
        finally:
            # A forked child leaves through os._exit, which skips what a spawned one runs
            # at exit: the atexit handlers (ndist's unlink the shared memory of a group a
            # skipped or failed test never destroyed).
            atexit._run_exitfuncs()


@pytest.fixture(scope="module", autouse=True)
def _remove_run_dir():
    yield
    for name in os.listdir(_RUN_DIR):
        if not name.startswith("pymp-"):  # (multiprocessing's own: it removes it at exit)
            path = os.path.join(_RUN_DIR, name)
            shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.unlink(path)
    # the folder itself after multiprocessing's clean-up (exit priority -100) at exit
    multiprocessing.util.Finalize(None, shutil.rmtree, args=(_RUN_DIR,), kwargs={"ignore_errors": True},
                                  exitpriority=-200)
