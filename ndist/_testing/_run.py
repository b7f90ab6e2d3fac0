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

With ``launcher`` the ranks are started by a launcher instead (``ndistrun``,
``mpiexec``, ``torchrun``): one launcher process, in its own session, runs
``world_size`` copies of the same entry point, each of which takes its rank from
the launcher's environment and its function from this run's store (named in
``NDIST_TESTING_STORE``, so that it never meets the launcher's own store).

With ``hosts`` (network namespaces of ``make_hosts``) ``ndistrun --nnodes H`` runs in every
namespace, and the store is hosted in the first one, on its address, where every host reaches
it: this process's calling thread enters that namespace for the run (``_netns.inside``).
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Mapping

from ..runtime import DistError, DistTimeoutError, _shmfiles
from ..runtime.store import TCPStore, TCPStoreServer
from . import _netns

__all__ = ["run_ranks", "RankFailedError", "Results", "kill_tree"]

log = logging.getLogger("ndist.runtime.testing")

PREFIX = "ndist.testing/"
#: where a rank started by a launcher finds this run's store, and the store's secret
STORE_VAR, SECRET_VAR = "NDIST_TESTING_STORE", "NDIST_TESTING_SECRET"
LAUNCHERS = ("spawn", "ndistrun", "mpiexec", "torchrun")
_RANK_MAIN = ("-m", "ndist._testing._rank_main")
# Variables of an enclosing MPI / Slurm launch: a rank of run_ranks is not an MPI rank.
_LAUNCHER_VARS = ("PMI_", "PMIX_", "OMPI_", "MPI_LOCAL", "HYDRA_", "HYDI_", "SLURM_", "I_MPI_")


class Results(list):
    """Every rank's result, by rank; ``launcher_exitcode``: the exit status of the launcher
    that started the ranks (negative: killed by that signal; with ``hosts``: the first host's),
    None without one; ``launcher_exitcodes``: every launcher's, by host (``[]`` without one);
    ``shm_left``: the names of the files the job left in ``/dev/shm`` (``run_ranks`` removed
    them)."""

    launcher_exitcode: int | None = None
    launcher_exitcodes: list = []
    shm_left: list = []


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


def _describe_exit(code: int, unreported: str = " without reporting a result") -> str:
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}{unreported}"


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


def _tree(pid: int) -> list[int]:
    """``pid`` and every process below it, parents first. A launcher's workers may each run
    in a session of their own (Hydra's proxies and ranks do), out of reach of its process
    group, so the tree is walked through /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    todo, tree = [pid], []
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    return tree


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it, the deepest first (a launcher cannot
    start a replacement for a rank once the rank is gone before it). A launcher's ranks in
    sessions of their own (Hydra's proxies and ranks, ``ndistrun``'s) are reached too: the
    tree is walked through /proc."""
    for p in reversed(_tree(pid)):
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _launcher_command(launcher: str, world_size: int, options=()) -> list[str]:
    """The command that starts ``world_size`` ranks of ``run_ranks`` under ``launcher``, with
    the launcher's own ``options`` (e.g. ndistrun's ``--on-failure continue``)."""
    options = list(options)
    if launcher == "ndistrun":
        return [sys.executable, "-m", "ndist.launch", "--nproc-per-node", str(world_size), *options, *_RANK_MAIN]
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world_size),
                "--monitor-interval", "0.1", *options, *_RANK_MAIN]
    if launcher == "mpiexec":
        exe = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
        if exe is None:
            raise FileNotFoundError("launcher: 'mpiexec' is neither beside the interpreter nor on PATH")
        return [exe, "-n", str(world_size), *options, sys.executable, *_RANK_MAIN]
    raise ValueError(f"launcher: expected one of {LAUNCHERS}, got {launcher!r}")


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


def _check_hosts(hosts, per_host, world_size, launcher) -> list[int] | None:
    """The number of ranks on each host (None without ``hosts``)."""
    if hosts is None:
        if per_host is not None:
            raise ValueError(f"per_host: expected None without hosts, got {per_host!r}")
        return None
    if not isinstance(hosts, _netns.Hosts):
        raise TypeError(f"hosts: expected the Hosts of ndist.testing.make_hosts, got {type(hosts).__name__}")
    if not hosts.ns:
        raise ValueError(f"hosts: expected at least one namespace, got {hosts.ns!r}")
    if launcher not in ("spawn", "ndistrun"):
        raise ValueError(f"launcher: expected 'ndistrun' (or the default) with hosts, got {launcher!r}")
    count = len(hosts.ns)
    if per_host is None:
        if world_size % count:
            raise ValueError(f"world_size: expected a multiple of the {count} hosts (or per_host), got {world_size}")
        return [world_size // count] * count
    if isinstance(per_host, (str, bytes)) or not hasattr(per_host, "__iter__"):
        raise TypeError(f"per_host: expected a sequence of ints, got {type(per_host).__name__}")
    per_host = list(per_host)
    if (len(per_host) != count or sum(per_host) != world_size
            or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in per_host)):
        raise ValueError(f"per_host: expected {count} positive ints summing to world_size {world_size}, "
                         f"got {per_host!r}")
    return per_host


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
    launcher: str = "spawn",
    launcher_options: Any = (),
    hosts: _netns.Hosts | None = None,
    per_host: Any = None,
) -> Results:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` fresh processes; return
    the results by rank (a list; ``.launcher_exitcode``: see ``launcher``).

    ``may_die``: ranks whose death (killed, or an exit without a result) is part of
    the test: the run goes on without them and their result is None (a rank-loss
    test's victims). An exception they raise still fails the run.

    With ``init`` every rank calls ``init_process_group(backend)`` first (a
    rendezvous on a store hosted here) and ``destroy_process_group()`` after.
    ``env`` is added to the ranks' environment only; ``transport`` sets
    ``NDIST_TRANSPORT`` (``"tcp"`` / ``"shm"``) for the socket backend.

    ``launcher``: ``"spawn"`` (one process per rank, started here, with ``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` of a store hosted here), or the
    launcher that starts them as a user's job would be: ``"ndistrun"``, ``"mpiexec"`` or
    ``"torchrun"`` (their rendezvous is theirs; under torchrun, ``init`` joins torch's
    process group on ``backend``, a torch backend name such as ``"ndist"``). A rank that ends
    without a result under a launcher fails the run once the launcher has exited;
    ``launcher_options``: the launcher's own options (``["--on-failure", "continue"]``). A
    launcher's temporary files (ndistrun's job folder, torchrun's logs) go to a folder of
    this run, removed at the end.

    ``hosts``: the ``Hosts`` of ``make_hosts`` (network namespaces): ``ndistrun --nnodes H``
    in each (``node_commands``; ``launcher_options`` are added to every one), ``per_host``
    ranks on each (default: ``world_size`` split evenly), ranks numbered host by host. Every
    launcher's exit status is in ``.launcher_exitcodes``.
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
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher: expected one of {LAUNCHERS}, got {launcher!r}")
    if isinstance(launcher_options, (str, bytes)) or not all(isinstance(o, str) for o in launcher_options):
        raise TypeError(f"launcher_options: expected a sequence of str, got {launcher_options!r}")
    if launcher_options and launcher == "spawn":
        raise ValueError(f"launcher_options: expected none with launcher 'spawn', got {list(launcher_options)}")
    counts = _check_hosts(hosts, per_host, world_size, launcher)
    if counts is not None:
        launcher = "ndistrun"
    command = None if launcher == "spawn" or counts else _launcher_command(launcher, world_size, launcher_options)
    import cloudpickle  # lazy: only tests need it

    payload = cloudpickle.dumps((fn, tuple(args), init, backend, float(timeout), launcher))
    secret = secrets.token_hex(32)
    with _netns.inside(hosts.ns[0]) if counts else contextlib.nullcontext():
        return _start_and_collect(payload, secret, world_size, timeout, env, transport, may_die, command, hosts,
                                  counts, tuple(launcher_options))


def _start_and_collect(payload, secret, world_size, timeout, env, transport, may_die, command, hosts, counts,
                       options) -> Results:
    addr = hosts.addr[0] if counts else "127.0.0.1"
    server = TCPStoreServer(addr, 0, secret)
    procs: list[subprocess.Popen] = []
    launcher_tmp = None
    results = None
    try:
        store = TCPStore(addr, server.port, timeout=max(30.0, timeout), secret=secret)
        store.set(PREFIX + "payload", payload)
        store.set(PREFIX + "sys_path", json.dumps(sys.path))
        base = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_VARS)}
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            base.pop(k, None)
        base.update(env or {})
        base.update({STORE_VAR: f"{addr}:{server.port}", SECRET_VAR: secret})
        if transport is not None:
            base["NDIST_TRANSPORT"] = transport
        if command is not None or counts:
            for k in ("NDIST_STORE", "NDIST_SECRET"):  # (an enclosing job's)
                base.pop(k, None)
            launcher_tmp = tempfile.mkdtemp(prefix="ndist-testing-")
            base["TMPDIR"] = launcher_tmp
            if counts:  # one job across the hosts: one secret, this checkout's ndist on every host
                path = os.pathsep.join(p for p in (str(_netns._IMPORT_ROOT), base.get("PYTHONPATH", "")) if p)
                base.update(NDIST_SECRET=secret, PYTHONPATH=path)
                commands = _netns.node_commands(hosts, counts, list(_RANK_MAIN), _netns._LAUNCH_EXTRA + options)
            else:
                commands = [command]
            for cmd in commands:
                procs.append(subprocess.Popen(cmd, env=base, start_new_session=True, stdin=subprocess.DEVNULL))
            results = Results(_collect(store, procs, timeout, may_die, world_size))
            _wait_exited(procs, 30)  # the launchers end once their ranks have
            results.launcher_exitcodes = [_exit_code(p) if _exited(p) else None for p in procs]
            results.launcher_exitcode = results.launcher_exitcodes[0]
            return results
        base.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(server.port),
            NDIST_STORE=f"127.0.0.1:{server.port}",
            NDIST_SECRET=secret,
            WORLD_SIZE=str(world_size),
            LOCAL_WORLD_SIZE=str(world_size),
        )
        for rank in range(world_size):
            child_env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank))
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "ndist._testing._rank_main"],
                    env=child_env, start_new_session=True, stdin=subprocess.DEVNULL,
                )
            )
        results = Results(_collect(store, procs, timeout, may_die))
        _wait_exited(procs, 10)  # ranks that reported get to exit on their own
    finally:
        # Not reaped yet, so every rank's pid (= its session and process group id)
        # is still ours: kill each whole tree, finished or not, then reap.
        for p in procs:
            if (command is not None or counts) and p.returncode is None:
                kill_tree(p.pid)  # the launcher's ranks, in sessions of their own
            _kill_tree(p)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                log.warning("rank process %d did not exit after SIGKILL", p.pid)
        server.close()
        if launcher_tmp is not None:
            shutil.rmtree(launcher_tmp, ignore_errors=True)
        # the secret is this run's alone: whatever the ranks left in /dev/shm is ours
        prefix = _shmfiles.job_prefix(secret) + "-"
        left = sorted(os.path.basename(f) for f in glob.glob(os.path.join(_shmfiles.SHM_DIR, glob.escape(prefix) + "*")))
        _shmfiles.unlink_prefix(prefix)
        if results is not None:
            results.shm_left = left
    return results


def _collect(store: TCPStore, procs: list[subprocess.Popen], timeout: float, may_die=frozenset(),
             world_size: int | None = None) -> list[Any]:
    """Every rank's result. ``procs``: one process per rank, or (``world_size`` given) the
    launchers of every rank (one, or one per host)."""
    import cloudpickle

    launched = world_size is not None
    world_size = len(procs) if world_size is None else world_size
    ended_at = None  # when the launcher was first seen exited
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
        if launched and all(_exited(p) for p in procs) and len(results) < world_size:
            # the launchers are gone: a report on its way still arrives, for a moment
            ended_at = time.monotonic() if ended_at is None else ended_at
            if time.monotonic() - ended_at > 1.0:
                for rank in range(world_size):
                    if rank not in results and rank in may_die:
                        results[rank] = None
                missing = [r for r in range(world_size) if r not in results]
                if missing:
                    code = next((c for c in map(_exit_code, procs) if c != 0), 0)
                    raise RankFailedError(missing[0], f"ranks {missing} ended without reporting a result (their "
                                                      f"launcher {_describe_exit(code, '')})", exitcode=code)
        for rank, p in enumerate(() if launched else procs):
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
