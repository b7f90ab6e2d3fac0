"""The local worker group: start the ranks of one attempt, watch them, tear them down.

Each rank is started in its own session (so its process group holds the
rank and everything it starts), with its stdout / stderr on pipes, a log
file or ``/dev/null`` as ``--redirects`` / ``--tee`` / ``--local-ranks-filter``
say. One ``selectors`` loop in the launcher's main thread forwards output,
notices exits through pidfds (``os.pidfd_open``; a 10 ms poll where that is
missing) and wakes on signals through a self-pipe: nothing sleeps.

When a rank fails, every other rank's process group gets SIGTERM, then
SIGKILL after ``term_timeout`` (with ``--on-failure continue``, only once the
agent's ``on_loss`` says too few ranks are left); when the launcher is interrupted, the signal
it got is forwarded the same way. After the last rank is reaped, whatever
is left in the ranks' process groups is killed, so no process outlives the
group.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ._output import StreamPump

__all__ = ["WorkerSpec", "WorkerGroup", "Failure", "GroupResult", "signal_name", "how_it_ended"]

log = logging.getLogger("ndist.launch")

# Byte written to the wake pipe (besides signal numbers) when the job must stop
# because another node failed.
WAKE_STOP = 0


def set_child_subreaper(on: bool) -> bool:
    """Make this process adopt its orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``).

    Then a process a rank started in a new session (out of the rank's
    process group) becomes our child when the rank exits, and is killed with
    the group's leftovers. False where unsupported.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(36, 1 if on else 0, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def _adopted_children(known: set[int]) -> list[int]:
    """Our children that are not ranks: orphans we adopted as a subreaper."""
    pids: set[int] = set()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return []
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids.update(int(p) for p in f.read().split())
        except (OSError, ValueError):
            continue
    return sorted(pids - known)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def how_it_ended(returncode: int) -> str:
    """``exit code 3`` / ``killed by SIGKILL``: a process's end from its ``returncode``."""
    return f"killed by {signal_name(-returncode)}" if returncode < 0 else f"exit code {returncode}"


@dataclass(frozen=True)
class WorkerSpec:
    rank: int
    local_rank: int
    argv: tuple[str, ...]
    env: dict
    stdout: str | None = None  # log file path, or None
    stderr: str | None = None
    tee_stdout: bool = False  # also to the console (only with a log file)
    tee_stderr: bool = False
    console: bool = True  # forward to the launcher's stdout / stderr
    prefix: bytes = b""
    error_file: str | None = None
    replacement: int = 0  # ``--on-failure replace``: the n-th process started for this rank (0: the first)


@dataclass
class Failure:
    """A rank that exited non-zero on its own (not because the launcher stopped it)."""

    rank: int
    local_rank: int
    pid: int
    host: str
    returncode: int  # negative: killed by that signal
    timestamp: float
    error_file: str | None = None
    record: dict | None = None  # what the rank wrote to its error file
    stopped: bool = False  # it had failed, but exited only when the launcher stopped it
    #: it ended before it joined its first init_process_group (``_ends``); with exit code 0
    #: a failure only because other ranks waited for it there
    before_join: bool = False
    #: ``--on-failure replace``: this process was the rank's n-th replacement (0: the first process)
    replacement: int = 0
    #: ``--on-failure replace``: the pid of the process started in its place (None: not replaced)
    replaced_by: int | None = None

    @property
    def exit_status(self) -> int:
        """The launcher's exit status for this failure (128 + signal for a signal;
        1, Python's status for an unhandled exception, when the launcher's signal ended it;
        1 for a rank that exited 0 before it joined while others waited for it)."""
        if self.stopped or self.returncode == 0:
            return 1
        return self.returncode if self.returncode > 0 else 128 - self.returncode

    def describe_exit(self) -> str:
        if self.stopped:
            how = f"killed by {signal_name(-self.returncode)}" if self.returncode < 0 else f"exit code {self.returncode}"
            return f"raised, then was stopped by the launcher while exiting ({how})"
        how = how_it_ended(self.returncode)
        if self.returncode < 0:
            how += f" (exit status {self.exit_status})"
        return how + (", before it joined the group (init_process_group)" if self.before_join else "")

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in ("rank", "local_rank", "pid", "host", "returncode", "timestamp",
                                              "error_file", "record", "stopped", "before_join", "replacement",
                                              "replaced_by")}

    @classmethod
    def from_json(cls, d: dict) -> "Failure":
        return cls(**d)


@dataclass
class GroupResult:
    # "succeeded" | "failed" | "interrupted" | "stopped"; or, with ``on_loss``,
    # "continued": every rank ended on its own, ``failures`` are the ranks lost on the way
    state: str
    failures: list[Failure] = field(default_factory=list)
    signal: int | None = None  # the launcher's signal for "interrupted"
    origin: str | None = None  # where that signal was received, when not here ("on node 0")
    ok: int = 0  # ranks that exited with status 0
    #: ``--on-failure replace``: the losses a new process was started for (``replaced_by``), in order
    replaced: list[Failure] = field(default_factory=list)

    @property
    def root_cause(self) -> Failure | None:
        return min(self.failures, key=lambda f: (f.timestamp, f.rank)) if self.failures else None


class _Worker:
    __slots__ = ("spec", "proc", "pid", "pidfd", "pumps", "returncode", "signalled")

    def __init__(self, spec: WorkerSpec, proc: subprocess.Popen, pumps: list[StreamPump]) -> None:
        self.spec = spec
        self.proc = proc
        self.pid = proc.pid
        self.pumps = pumps
        self.returncode: int | None = None
        self.signalled = False
        self.pidfd: int | None = None
        try:
            self.pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            pass

    def kill_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _open_log(path: str):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return open(path, "ab", buffering=0)


class WorkerGroup:
    """The ranks of one attempt on this node."""

    def __init__(
        self, specs: list[WorkerSpec], term_timeout: float, wake_fd: int | None = None, adopt_orphans: bool = False
    ) -> None:
        """``adopt_orphans``: this process is a child subreaper whose only other
        children are orphans of the ranks (the ``ndistrun`` command): kill them at the end."""
        self.specs = specs
        self.adopt_orphans = adopt_orphans
        self.term_timeout = term_timeout
        self.wake_fd = wake_fd
        self.workers: list[_Worker] = []
        self.host = socket.gethostname()
        self._teardown_wall = float("inf")  # wall-clock time the teardown began
        self._teardown_sig = signal.SIGTERM

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers]

    # ------------------------------------------------------------ start
    def start(self) -> None:
        for spec in self.specs:
            try:
                self.workers.append(self._spawn(spec))
            except BaseException:
                self._kill_all(signal.SIGKILL)
                self._reap_all_blocking()
                raise

    def _spawn(self, spec: WorkerSpec) -> _Worker:
        streams = (("stdout", spec.stdout, spec.tee_stdout, 1), ("stderr", spec.stderr, spec.tee_stderr, 2))
        files, targets = [], {}
        try:
            for name, path, tee, _ in streams:
                to_console = spec.console and (path is None or tee)
                if to_console:
                    targets[name] = subprocess.PIPE  # through a pump (prefix, maybe tee)
                elif path is not None:
                    files.append(_open_log(path))  # straight to the file: no pump needed
                    targets[name] = files[-1]
                else:
                    targets[name] = subprocess.DEVNULL
            proc = subprocess.Popen(
                spec.argv,
                env=spec.env,
                stdin=subprocess.DEVNULL,
                stdout=targets["stdout"],
                stderr=targets["stderr"],
                start_new_session=True,
                close_fds=True,
            )
        finally:
            for f in files:
                f.close()  # the child has its own descriptor
        pumps = []
        for name, path, _, console_fd in streams:
            pipe = getattr(proc, name)
            if pipe is not None:
                fd = os.dup(pipe.fileno())
                pipe.close()
                pumps.append(StreamPump(fd, console_fd, spec.prefix, _open_log(path) if path else None))
        log.debug("started rank %d (local rank %d) as pid %d", spec.rank, spec.local_rank, proc.pid)
        return _Worker(spec, proc, pumps)

    def abort(self) -> None:
        """SIGKILL every rank's process group and reap the ranks (before ``monitor``)."""
        self._kill_all(signal.SIGKILL)
        self._reap_all_blocking()
        for w in self.workers:
            for p in w.pumps:
                p.close()

    # ------------------------------------------------------------ watch
    def monitor(self, on_loss: Callable[[Failure], bool] | None = None,
                on_exit: Callable[[WorkerSpec, int, int], None] | None = None,
                replace: Callable[[Failure], WorkerSpec | None] | None = None,
                on_replaced: Callable[[Failure], None] | None = None) -> GroupResult:
        """Forward output and wait until every rank has exited; tear down on failure.

        Each byte read from ``wake_fd`` is a signal number the launcher got
        (forwarded to the ranks; the group ends "interrupted") or
        ``WAKE_STOP`` (another node failed; the group ends "stopped").

        ``on_loss`` (``--on-failure continue``): called with each rank that fails
        on its own; the others run on unless it returns True (too few ranks
        left), which tears the group down ("failed"). Without a teardown the
        group ends "continued" when it lost ranks.

        ``on_exit(spec, pid, returncode)``: called with every rank as it is reaped, whatever
        its status, before ``on_loss``; it must not block.

        ``replace`` (``--on-failure replace``): called with each rank that fails on its own,
        before ``on_loss``; the spec it returns is started in the rank's place (the failure goes
        to ``replaced``, with the new pid, instead of ``failures``), and ``on_loss`` is not
        called for it. None: the rank is lost as without ``replace``. ``on_replaced(f)``: called
        once the new process runs (``f.replaced_by`` is its pid).
        """
        sel = selectors.DefaultSelector()
        live: dict[int, _Worker] = {}
        for w in self.workers:
            live[w.pid] = w
            for p in w.pumps:
                sel.register(p.fd, selectors.EVENT_READ, ("pump", p))
            if w.pidfd is not None:
                sel.register(w.pidfd, selectors.EVENT_READ, ("exit", w))
        if self.wake_fd is not None:
            sel.register(self.wake_fd, selectors.EVENT_READ, ("wake", None))
        result = GroupResult("succeeded")
        deadline: float | None = None  # SIGKILL time while tearing down
        stopping = False
        try:
            while live:
                polling = any(w.pidfd is None for w in live.values())  # (a replacement may add one)
                timeout = 0.01 if polling else None
                if deadline is not None:
                    left = max(0.0, deadline - time.monotonic())
                    timeout = left if timeout is None else min(timeout, left)
                exited: list[_Worker] = []
                for key, _ in sel.select(timeout):
                    kind, obj = key.data
                    if kind == "pump":
                        if not obj.read_available():
                            sel.unregister(key.fd)
                            obj.close()
                    elif kind == "exit":
                        if obj.proc.poll() is not None:
                            exited.append(obj)
                    else:
                        for b in self._read_wake():
                            if b == WAKE_STOP:
                                if not stopping:
                                    log.warning("stopping the local ranks: a rank on another node failed")
                                    result.state, stopping = "stopped", True
                                    deadline = self._begin_teardown(signal.SIGTERM)
                            elif not stopping:
                                log.warning("got %s: forwarding it to every rank", signal_name(b))
                                result.state, result.signal, stopping = "interrupted", b, True
                                deadline = self._begin_teardown(b)
                            else:  # a second signal, or one during a teardown: no more grace
                                self._kill_all(signal.SIGKILL)
                                deadline = None
                if polling:
                    exited.extend(w for w in live.values() if w not in exited and w.proc.poll() is not None)
                teardown_wall = self._teardown_wall
                lost: list[Failure] = []
                for w in exited:
                    del live[w.pid]
                    w.returncode = w.proc.returncode
                    if w.pidfd is not None:
                        sel.unregister(w.pidfd)
                        os.close(w.pidfd)
                        w.pidfd = None
                    self._drain(w, sel)
                    if on_exit is not None:
                        on_exit(w.spec, w.pid, w.returncode)
                    if w.returncode != 0:
                        f = self._failure(w)
                        # A rank we signalled still counts if its error record
                        # predates the teardown: it failed on its own, just
                        # exited later (slow atexit handlers, say).
                        if not w.signalled:
                            result.failures.append(f)
                            lost.append(f)
                        elif f.record is not None and f.timestamp < teardown_wall:
                            f.stopped = True
                            result.failures.append(f)
                    log.debug("rank %d (pid %d) exited with %s", w.spec.rank, w.pid, w.returncode)
                if lost and not stopping and replace is not None:
                    lost = [f for f in lost if not self._replaced(f, replace, on_replaced, result, sel, live)]
                    if not lost and result.state == "succeeded":
                        result.state = "continued"
                if lost and not stopping:
                    # every loss is reported, in exit order, even when an earlier one already says stop
                    if on_loss is None or any([on_loss(f) for f in lost]):
                        result.state = "failed"
                        stopping = True
                        deadline = self._begin_teardown(signal.SIGTERM)
                    else:
                        result.state = "continued"
                if deadline is not None and live and time.monotonic() >= deadline:
                    names = ", ".join(str(w.spec.rank) for w in live.values())
                    log.warning(
                        "ranks %s did not exit within %.3g s of %s: sending SIGKILL",
                        names, self.term_timeout, signal_name(self._teardown_sig),
                    )
                    self._kill_all(signal.SIGKILL)
                    deadline = None
        finally:
            self._kill_all(signal.SIGKILL, leftovers=True)
            if live:  # an exception escaped: do not leave anything behind
                self._reap_all_blocking()
            if self.adopt_orphans:
                self._kill_adopted()
            for w in self.workers:
                self._drain(w, sel, final=True)
            sel.close()
        result.ok = sum(1 for w in self.workers if w.returncode == 0)
        return result

    def _replaced(self, f: Failure, replace, on_replaced, result: GroupResult, sel, live: dict) -> bool:
        """Start the process ``replace(f)`` gives in ``f``'s place, watched like the others;
        whether one was started (``f`` then moves from ``failures`` to ``replaced``)."""
        spec = replace(f)
        if spec is None:
            return False
        w = self._spawn(spec)
        self.workers.append(w)
        live[w.pid] = w
        for p in w.pumps:
            sel.register(p.fd, selectors.EVENT_READ, ("pump", p))
        if w.pidfd is not None:
            sel.register(w.pidfd, selectors.EVENT_READ, ("exit", w))
        f.replaced_by = w.pid
        result.failures.remove(f)
        result.replaced.append(f)
        if on_replaced is not None:
            on_replaced(f)
        return True

    def _kill_adopted(self) -> None:
        # Processes that left their rank's process group (setsid, daemons) and
        # were re-parented to us when their parent exited: kill and reap them.
        for pid in _adopted_children({w.pid for w in self.workers}):
            log.debug("killing pid %d, left behind by a rank outside its process group", pid)
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass

    def _read_wake(self) -> bytes:
        try:
            return os.read(self.wake_fd, 64)
        except BlockingIOError:
            return b""

    def _begin_teardown(self, sig: int) -> float:
        self._teardown_wall, self._teardown_sig = time.time(), sig
        for w in self.workers:
            if w.returncode is None:
                w.signalled = True
        self._kill_all(sig)
        return time.monotonic() + self.term_timeout

    def _kill_all(self, sig: int, leftovers: bool = False) -> None:
        """Signal every rank's process group (the exited ones too with ``leftovers``)."""
        for w in self.workers:
            if leftovers or w.returncode is None:
                w.kill_group(sig)

    def _reap_all_blocking(self) -> None:
        for w in self.workers:
            if w.returncode is None:
                w.kill_group(signal.SIGKILL)
                w.returncode = w.proc.wait()
            if w.pidfd is not None:
                os.close(w.pidfd)
                w.pidfd = None

    def _drain(self, w: _Worker, sel, final: bool = False) -> None:
        for p in w.pumps:
            if p.closed:
                continue
            if not p.read_available() or final:
                try:
                    sel.unregister(p.fd)
                except (KeyError, ValueError):
                    pass
                p.close()

    def _failure(self, w: _Worker) -> Failure:
        record = None
        if w.spec.error_file:
            try:
                import json

                with open(w.spec.error_file) as f:
                    record = json.load(f)
            except (OSError, ValueError):
                record = None
        ts = record.get("timestamp") if isinstance(record, dict) else None
        return Failure(
            rank=w.spec.rank,
            local_rank=w.spec.local_rank,
            pid=w.pid,
            host=self.host,
            returncode=w.returncode,
            timestamp=ts if isinstance(ts, (int, float)) else time.time(),
            error_file=w.spec.error_file,
            record=record,
            replacement=w.spec.replacement,
        )
