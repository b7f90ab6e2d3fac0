"""run_ranks: run a function on N ranks in fresh processes, for tests.

The parent hosts a ``TCPStoreServer`` on loopback (port 0, a fresh job
secret) and starts ``world_size`` interpreters (``python -m
ndist._testing._rank_main``), each in its own session so that the whole tree
of a rank can be killed. The function and its arguments travel through the
store (cloudpickle, so closures and lambdas work); each rank writes its
outcome back there. The first rank to fail, by exception or by exit, ends the
run: every rank is killed and ``RankFailedError`` carries the failed rank's
number, exit code and traceback. A run that outlives ``timeout`` is killed
and reported as ``DistTimeoutError`` naming the ranks that had not finished.
Whatever the ranks left in ``/dev/shm`` (files named from this run's secret)
is removed at the end.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Mapping

from ..runtime import DistError, DistTimeoutError, _shmfiles
from ..runtime.store import TCPStore, TCPStoreServer

__all__ = ["run_ranks", "RankFailedError"]

log = logging.getLogger("ndist.runtime.testing")

PREFIX = "ndist.testing/"
# Variables of an enclosing MPI / Slurm launch: a rank of run_ranks is not an MPI rank.
_LAUNCHER_VARS = ("PMI_", "PMIX_", "OMPI_", "MPI_LOCAL", "HYDRA_", "HYDI_", "SLURM_", "I_MPI_")


class RankFailedError(DistError):
    """A rank of ``run_ranks`` failed: ``rank``, ``exitcode`` (None if it raised
    and reported), ``traceback`` (the child's, as text) and ``exception`` (the
    child's exception, when it could be sent back)."""

    def __init__(self, rank: int, message: str, traceback: str = "", exitcode: int | None = None,
                 exception: BaseException | None = None) -> None:
        text = f"rank {rank} failed: {message}"
        if traceback:
            text += f"\n\n--- traceback of rank {rank} ---\n{traceback.rstrip()}"
        super().__init__(text)
        self.rank = rank
        self.exitcode = exitcode
        self.traceback = traceback
        self.exception = exception

    def __reduce__(self):
        return (_rebuild, (self.rank, str(self), self.exitcode))


def _rebuild(rank, text, exitcode):
    err = RankFailedError(rank, "", exitcode=exitcode)
    err.args = (text,)
    return err


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code} without reporting a result"


def _exited(proc: subprocess.Popen) -> bool:
    """True once ``proc`` has exited, without reaping it (its pid stays reserved)."""
    if proc.returncode is not None:
        return True
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _exit_code(proc: subprocess.Popen) -> int:
    """The exit status of an exited, unreaped ``proc`` (negative: killed by that signal)."""
    if proc.returncode is not None:
        return proc.returncode
    info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    return -info.si_status if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else info.si_status


def _wait_exited(procs: list[subprocess.Popen], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not all(_exited(p) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.01)


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the rank's whole process group (the rank and everything it started).

    Only called before ``proc`` is reaped, so its pid cannot have been reused.
    """
    if proc.returncode is not None:
        return  # reaped: the id may belong to someone else now
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _check_args(fn, world_size, timeout, env, args):
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size: expected a positive int, got {world_size!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout: expected a positive number of seconds, got {timeout!r}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args: expected a tuple, got {type(args).__name__}")
    if env is not None:
        if not isinstance(env, Mapping):
            raise TypeError(f"env: expected a mapping of str to str, got {type(env).__name__}")
        for k, v in env.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError(f"env: expected str keys and values, got {k!r}: {v!r}")


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *,
    args: tuple = (),
    backend: str | None = "socket",
    timeout: float = 60,
    init: bool = True,
    env: Mapping[str, str] | None = None,
    transport: str | None = None,
    may_die: Any = (),
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` fresh processes; return
    the results by rank.

    ``may_die``: ranks whose death (killed, or an exit without a result) is part of
    the test: the run goes on without them and their result is None (a rank-loss
    test's victims). An exception they raise still fails the run.

    With ``init`` every rank calls ``init_process_group(backend)`` first (a
    rendezvous on a store hosted here) and ``destroy_process_group()`` after.
    ``env`` is added to the ranks' environment only; ``transport`` sets
    ``NDIST_TRANSPORT`` (``"tcp"`` / ``"shm"``) for the socket backend.
    """
    _check_args(fn, world_size, timeout, env, args)
    if isinstance(may_die, (str, bytes)) or not hasattr(may_die, "__iter__"):
        raise TypeError(f"may_die: expected an iterable of ranks, got {type(may_die).__name__}")
    may_die = frozenset(may_die)
    bad = sorted(r for r in may_die if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < world_size)
    if bad:
        raise ValueError(f"may_die: expected ranks in [0, {world_size}), got {bad}")
    if transport is not None and transport not in ("tcp", "shm", "auto"):
        raise ValueError(f"transport: expected 'tcp', 'shm', 'auto' or None, got {transport!r}")
    import cloudpickle  # lazy: only tests need it

    payload = cloudpickle.dumps((fn, tuple(args), init, backend, float(timeout)))
    secret = secrets.token_hex(32)
    server = TCPStoreServer("127.0.0.1", 0, secret)
    procs: list[subprocess.Popen] = []
    try:
        store = TCPStore("127.0.0.1", server.port, timeout=max(30.0, timeout), secret=secret)
        store.set(PREFIX + "payload", payload)
        store.set(PREFIX + "sys_path", json.dumps(sys.path))
        base = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_VARS)}
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            base.pop(k, None)
        base.update(env or {})
        base.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(server.port),
            NDIST_STORE=f"127.0.0.1:{server.port}",
            NDIST_SECRET=secret,
            WORLD_SIZE=str(world_size),
            LOCAL_WORLD_SIZE=str(world_size),
        )
        if transport is not None:
            base["NDIST_TRANSPORT"] = transport
        for rank in range(world_size):
            child_env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank))
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "ndist._testing._rank_main"],
                    env=child_env, start_new_session=True, stdin=subprocess.DEVNULL,
                )
            )
        results = _collect(store, procs, timeout, may_die)
        _wait_exited(procs, 10)  # ranks that reported get to exit on their own
    finally:
        # Not reaped yet, so every rank's pid (= its session and process group id)
        # is still ours: kill each whole tree, finished or not, then reap.
        for p in procs:
            _kill_tree(p)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                log.warning("rank process %d did not exit after SIGKILL", p.pid)
        server.close()
        # the secret is this run's alone: whatever the ranks left in /dev/shm is ours
        _shmfiles.unlink_prefix(_shmfiles.job_prefix(secret) + "-")
    return results


def _collect(store: TCPStore, procs: list[subprocess.Popen], timeout: float, may_die=frozenset()) -> list[Any]:
    import cloudpickle

    world_size = len(procs)
    deadline = time.monotonic() + timeout
    results: dict[int, Any] = {}
    seen = 0
    while len(results) < world_size:
        # Wake as soon as a rank reports; otherwise look at the processes every 50 ms.
        try:
            store.wait([f"{PREFIX}event/{seen + 1}"], 0.05)
        except DistTimeoutError:
            pass
        while store.check([f"{PREFIX}event/{seen + 1}"]):
            seen += 1
            rank = int(store.get(f"{PREFIX}event/{seen}"))
            outcome = cloudpickle.loads(store.get(f"{PREFIX}result/{rank}"))
            if outcome[0] == "error":
                _, message, tb, exc = outcome
                exc_obj = None
                if exc is not None:
                    try:
                        exc_obj = cloudpickle.loads(exc)
                    except Exception:  # noqa: BLE001 - the text is enough
                        exc_obj = None
                raise RankFailedError(rank, message, tb, exception=exc_obj) from exc_obj
            results[rank] = outcome[1]
        for rank, p in enumerate(procs):
            if rank in results or not _exited(p):
                continue
            if store.check([f"{PREFIX}result/{rank}"]):
                continue  # reported; its event is read on the next pass
            if rank in may_die:
                results[rank] = None
                continue
            code = _exit_code(p)
            raise RankFailedError(rank, _describe_exit(code), exitcode=code)
        if time.monotonic() > deadline:
            missing = [r for r in range(world_size) if r not in results]
            raise DistTimeoutError(
                f"run_ranks: ranks {missing} of {world_size} did not finish within {timeout:g} s; "
                f"all ranks were killed"
            )
    return [results[r] for r in range(world_size)]
