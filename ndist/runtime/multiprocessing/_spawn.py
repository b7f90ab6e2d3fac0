"""``spawn`` / ``start_processes``: run ``fn(i, *args)`` in ``nprocs`` processes.

Same semantics as ``torch.multiprocessing.spawn``:

* each child runs ``fn(i, *args)``; an exception in it is written (as the
  formatted traceback) to a per-child error file and the child exits with 1;
* the parent waits for the children; the first child that exits with a
  non-zero status makes the parent terminate the others (SIGTERM, then
  SIGKILL after a grace period) and raise ``ProcessRaisedException`` (the
  child raised; the message carries its traceback) or
  ``ProcessExitedException`` (it exited or was killed by a signal, with
  ``exit_code`` and ``signal_name``);
* ``join=False`` returns a :class:`ProcessContext` instead of waiting;
* children get ``SIGINT`` when the parent dies (Linux ``PR_SET_PDEATHSIG``).

After a child exited abnormally, file_system segments it created and nobody
holds any more are unlinked (``ndist.tensor._shm.reclaim``).
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
import warnings
import weakref

from ...tensor import _shm

__all__ = [
    "ProcessContext",
    "ProcessException",
    "ProcessRaisedException",
    "ProcessExitedException",
    "SpawnContext",
    "spawn",
    "start_processes",
]

log = logging.getLogger("ndist.runtime")

_ERROR_DIR_PREFIX = "ndist-spawn-"


class ProcessException(Exception):
    """A spawned process failed. ``error_index`` is its index, ``pid`` its pid."""

    def __init__(self, msg: str, error_index: int, pid: int):
        super().__init__(msg)
        self.msg = msg
        self.error_index = error_index
        self.pid = pid

    @property
    def error_pid(self) -> int:
        return self.pid

    def __reduce__(self):
        return type(self), (self.msg, self.error_index, self.pid)


class ProcessRaisedException(ProcessException):
    """The child raised an exception; the message contains its traceback."""


class ProcessExitedException(ProcessException):
    """The child exited with a non-zero code or was killed by a signal.

    ``exit_code`` is ``multiprocessing``'s exit code (``-N`` for signal N),
    ``signal_name`` the signal's name (``"SIGKILL"``) or ``None``.
    """

    def __init__(self, msg: str, error_index: int, error_pid: int, exit_code: int, signal_name: str | None = None):
        super().__init__(msg, error_index, error_pid)
        self.exit_code = exit_code
        self.signal_name = signal_name

    def __reduce__(self):
        return type(self), (self.msg, self.error_index, self.pid, self.exit_code, self.signal_name)


def _set_pdeathsig(sig: int) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _wrap(fn, i, args, error_file, parent_pid=None):
    _set_pdeathsig(signal.SIGINT)
    if parent_pid is not None and os.getppid() != parent_pid:
        return  # the parent died before the death signal was armed
    try:
        fn(i, *args)
    except KeyboardInterrupt:
        pass  # SIGINT: the parent is terminating us
    except Exception:
        import traceback

        tmp = error_file + ".tmp"
        with open(tmp, "wb") as fh:
            pickle.dump(traceback.format_exc(), fh)
        os.replace(tmp, error_file)  # the parent never sees half a traceback
        sys.exit(1)


class ProcessContext:
    """The processes started by :func:`start_processes` (``join=False``)."""

    def __init__(self, processes, error_files):
        self.error_files = error_files
        self.processes = processes
        self.sentinels = {process.sentinel: index for index, process in enumerate(processes)}
        # the error files' private folder (start_processes's) goes once every process is done and
        # joined (``join``), else with this context or at exit
        self._remove_error_dir = lambda: None
        dirs = {os.path.dirname(path) for path in error_files}
        if len(dirs) == 1 and os.path.basename(dirs.pop()).startswith(_ERROR_DIR_PREFIX):
            self._remove_error_dir = weakref.finalize(self, shutil.rmtree, os.path.dirname(error_files[0]), True)

    def pids(self) -> list[int]:
        return [int(process.pid) for process in self.processes]

    def _join_procs_with_timeout(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        for process in self.processes:
            process.join(max(0.0, end - time.monotonic()))

    def join(self, timeout: float | None = None, grace_period: float | None = None) -> bool:
        """Wait (up to ``timeout`` seconds) for the processes.

        Returns ``True`` once all of them exited cleanly, ``False`` if some are
        still running. If one exited with a non-zero status, the others are
        terminated (after ``grace_period`` seconds, if given, to let them
        stop by themselves) and the first failure is raised as
        ``ProcessRaisedException`` / ``ProcessExitedException``.
        """
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout must be >= 0 or None, got {timeout!r}")
        if not self.sentinels:
            return True
        ready = multiprocessing.connection.wait(self.sentinels.keys(), timeout=timeout)
        error_index = None
        for sentinel in ready:
            index = self.sentinels.pop(sentinel)
            process = self.processes[index]
            process.join()
            if process.exitcode != 0:
                error_index = index
                break
        if error_index is None:
            if self.sentinels:
                return False
            self._remove_error_dir()
            return True

        if grace_period is not None:
            self._join_procs_with_timeout(grace_period)
        for process in self.processes:
            if process.is_alive():
                log.warning("terminating process %d (pid %d) via signal SIGTERM", self.processes.index(process), process.pid)
                process.terminate()
        # A process stuck in native code may ignore SIGTERM: SIGKILL after a grace period.
        self._join_procs_with_timeout(30 if grace_period is None else grace_period)
        for process in self.processes:
            if process.is_alive():
                log.warning("process %d (pid %d) ignored SIGTERM; sending SIGKILL", self.processes.index(process), process.pid)
                process.kill()
            process.join()
        self.sentinels.clear()
        _shm.reclaim(self.pids())

        failed = self.processes[error_index]
        error_file = self.error_files[error_index]
        try:
            with open(error_file, "rb") as fh:
                original_trace = pickle.load(fh)
        except OSError:
            original_trace = None
        self._remove_error_dir()
        if original_trace is None:
            exitcode = failed.exitcode
            if exitcode < 0:
                try:
                    name = signal.Signals(-exitcode).name
                except ValueError:
                    name = f"<Unknown signal {-exitcode}>"
                raise ProcessExitedException(
                    f"process {error_index} terminated with signal {name}",
                    error_index=error_index, error_pid=failed.pid, exit_code=exitcode, signal_name=name,
                )
            raise ProcessExitedException(
                f"process {error_index} terminated with exit code {exitcode}",
                error_index=error_index, error_pid=failed.pid, exit_code=exitcode,
            )
        msg = f"\n\n-- Process {error_index} terminated with the following error:\n{original_trace}"
        raise ProcessRaisedException(msg, error_index, failed.pid)


class SpawnContext(ProcessContext):
    """Deprecated name of :class:`ProcessContext` (as in torch)."""

    def __init__(self, processes, error_files):
        warnings.warn("SpawnContext is renamed to ProcessContext", DeprecationWarning, stacklevel=2)
        super().__init__(processes, error_files)


def start_processes(fn, args=(), nprocs: int = 1, join: bool = True, daemon: bool = False, start_method: str = "spawn"):
    """Start ``nprocs`` processes running ``fn(i, *args)`` with ``start_method``.

    Returns ``None`` after they all finished when ``join`` is true, else a
    :class:`ProcessContext`.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(args, tuple):
        raise TypeError(f"args must be a tuple, got {type(args).__name__}")
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs must be a positive int, got {nprocs!r}")
    methods = multiprocessing.get_all_start_methods()
    if start_method not in methods:
        raise ValueError(f"start_method must be one of {methods}, got {start_method!r}")
    ctx = multiprocessing.get_context(start_method)
    # A private (0700) directory: a child's traceback file cannot be pre-empted by another user.
    error_dir = tempfile.mkdtemp(prefix=_ERROR_DIR_PREFIX)
    # forkserver children are the fork server's: their parent (and death signal) is not us.
    parent_pid = None if start_method == "forkserver" else os.getpid()
    error_files, processes = [], []
    try:
        for i in range(nprocs):
            # The file only appears if the child raised: none means a clean exit or a signal.
            path = os.path.join(error_dir, f"{i}.pickle")
            process = ctx.Process(target=_wrap, args=(fn, i, args, path, parent_pid), daemon=daemon)
            process.start()  # spawn: fn and args are pickled here
            error_files.append(path)
            processes.append(process)
    except BaseException:
        # e.g. fn is a lambda under spawn: do not leave the first children running.
        for process in processes:
            process.kill()
            process.join()
        shutil.rmtree(error_dir, ignore_errors=True)
        raise
    context = ProcessContext(processes, error_files)
    if not join:
        return context
    while not context.join():
        pass
    return None


def spawn(fn, args=(), nprocs: int = 1, join: bool = True, daemon: bool = False, start_method: str = "spawn"):
    """``start_processes`` with the ``spawn`` start method (torch's ``spawn``).

    Another ``start_method`` warns (``FutureWarning``) and is ignored, as in torch;
    use :func:`start_processes` for ``fork`` / ``forkserver``.
    """
    if start_method != "spawn":
        warnings.warn(
            f"This method only supports start_method=spawn (got: {start_method}).\n"
            "To use a different start_method use:\n\t\t ndist.multiprocessing.start_processes(...)",
            FutureWarning,
            stacklevel=2,
        )
    return start_processes(fn, args, nprocs, join, daemon, start_method="spawn")
