"""The per-node agent: rendezvous, start the ranks, watch them, restart or report.

One ``Agent.run()`` is one job on this node. Each attempt (the first run and
every restart allowed by ``--max-restarts``) rendezvouses (``_rdzv``),
starts the local worker group with its environment (``_workers``), and
waits for it, telling the job's store how each rank ended (``_ends``: a rank
that ended before it joined is named to the ranks waiting for it). With
``--on-failure replace`` a lost rank's process is replaced in the same attempt
(``_replace``: a new process on this node, ``--max-restarts`` times per rank). The
outcome is an ``AgentResult``: the exit status and, for a failure, the rank
that failed first, which the CLI turns into the summary.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from dataclasses import dataclass

from ._binding import BIND_CPU_ENV, BIND_TO_ENV, cpu_text
from ._config import STDERR, STDOUT, LaunchConfig
from ._ends import EndNotices
from ._outcome import JobOutcome
from ._output import format_prefix
from ._rdzv import LaunchError, Round, make_rendezvous
from ._workers import Failure, GroupResult, WorkerGroup, WorkerSpec, set_child_subreaper

__all__ = ["Agent", "AgentResult", "LaunchError", "rank_env"]

log = logging.getLogger("ndist.launch")

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: how long the agent waits for the store's answer about a rank's end (``_ends``): at once
#: from node 0's store (local); a remote store that does not answer within it is not waited for
_VERDICT_S = 1.0


@dataclass
class AgentResult:
    exit_status: int
    result: GroupResult
    attempts: int  # how many attempts ran
    log_dir: str | None  # the job's log directory, if it was kept
    outcome: JobOutcome | None = None  # --on-failure continue: the job-wide outcome of the last attempt


class _Interrupted(BaseException):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def rank_env(config: LaunchConfig, rnd: Round, local_rank: int, secret: str, error_file: str, attempt: int,
             replacement: int = 0) -> dict:
    """The environment of one rank: the launcher's plus the job's variables. ``replacement``
    (``--on-failure replace``): the n-th process started in the rank's place, which joins the
    running job (``NDIST_REPLACES``, ``NDIST_REPLACEMENT``: ``init_process_group`` waits to be
    admitted by the survivors' ``grow_group``)."""
    env = dict(os.environ)
    rank = rnd.rank_offset + local_rank
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(rnd.world_size),
        LOCAL_WORLD_SIZE=str(config.nproc_per_node),
        GROUP_RANK=str(config.node_rank),
        NODE_RANK=str(config.node_rank),
        GROUP_WORLD_SIZE=str(config.nnodes),
        MASTER_ADDR=rnd.master_addr,
        MASTER_PORT=str(rnd.torch_port),  # free: for rank 0's own store (torch's env://), as under torchrun
        NDIST_STORE=f"{rnd.master_addr}:{rnd.master_port}",
        NDIST_SECRET=secret,
        NDIST_ERROR_FILE=error_file,
        NDIST_RUN_ID=config.run_id,
        NDIST_RESTART_COUNT=str(attempt),
        NDIST_MAX_RESTARTS=str(config.max_restarts),
        PYTHONUNBUFFERED="1",
    )
    env[BIND_TO_ENV] = config.bind_to
    if config.bind_cpus:  # (the bootstrap binds the rank to them before the program's first line)
        env[BIND_CPU_ENV] = cpu_text(config.bind_cpus[local_rank])
    else:
        env.pop(BIND_CPU_ENV, None)  # (a launcher started by a bound rank: not its ranks' CPUs)
    if replacement:
        env.update(NDIST_REPLACES=str(rank), NDIST_REPLACEMENT=str(replacement))
    else:
        env.pop("NDIST_REPLACES", None)
        env.pop("NDIST_REPLACEMENT", None)
    if config.nproc_per_node > 1 and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = "1"  # as torchrun: N ranks x all cores threads thrash
    return env


def child_argv(config: LaunchConfig) -> tuple[str, ...]:
    """``python -c <load _bootstrap.py by path> entrypoint args``: see ``_bootstrap``.

    The bootstrap file is loaded as a standalone module, without importing
    the ``ndist`` package (and NumPy with it): a rank imports what its
    program imports, no more, and finds ``ndist`` (or not) exactly as plain
    ``python script.py`` would.
    """
    mode = "exec" if config.no_python else "module" if config.module else "script"
    here = os.path.dirname(os.path.abspath(__file__))
    # A plain path import (not importlib.util, which costs a rank ~3 ms of
    # contextlib/functools/collections); the entries are removed at once.
    code = (
        f"import sys;sys.path.insert(0,{here!r});import _bootstrap as m;"
        f"del sys.path[0],sys.modules['_bootstrap'];m.main({os.getpid()},{mode!r})"
    )
    return (sys.executable, "-c", code, config.entrypoint, *config.args)


class Agent:
    """``adopt_orphans``: become a child subreaper and kill what the ranks leave
    outside their process groups; only for a process whose children are all
    ours (the ``ndistrun`` command, not a program embedding ``run()``)."""

    def __init__(self, config: LaunchConfig, adopt_orphans: bool = False) -> None:
        self.config = config
        self.adopt_orphans = adopt_orphans
        self._keep_dir = config.log_dir is not None or bool(config.redirects) or bool(config.tee)
        self._wake_r = self._wake_w = None
        self._raise_on_signal = True
        self._old_handlers: dict = {}
        self._old_wakeup = None
        self.job_dir: str | None = None
        self._replacements: dict[int, int] = {}  # ``--on-failure replace``: rank -> processes started in its place

    # ------------------------------------------------------------ signals
    def _on_signal(self, signum, frame) -> None:
        # The wake-up fd already got the signal number; outside the monitor
        # loop (rendezvous, between attempts) it is raised instead.
        if self._raise_on_signal:
            raise _Interrupted(signum)

    def _install_signals(self) -> None:
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        if threading.current_thread() is not threading.main_thread():
            return  # signals stay with the main thread's owner; WAKE_STOP still works
        self._old_wakeup = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for sig in _FORWARDED:
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def _restore_signals(self) -> None:
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        if self._old_wakeup is not None:
            signal.set_wakeup_fd(self._old_wakeup)
        for fd in (self._wake_r, self._wake_w):
            if fd is not None:
                os.close(fd)

    # ------------------------------------------------------------ files
    def _make_job_dir(self) -> str:
        c = self.config
        if c.log_dir is not None:
            os.makedirs(c.log_dir, exist_ok=True)
            return tempfile.mkdtemp(prefix=f"{c.run_id}_", dir=c.log_dir)
        return tempfile.mkdtemp(prefix=f"ndistrun_{c.run_id}_")

    def _specs(self, rnd: Round, attempt: int, secret: str) -> list[WorkerSpec]:
        return [self._spec(rnd, attempt, secret, lr) for lr in range(self.config.nproc_per_node)]

    def _spec(self, rnd: Round, attempt: int, secret: str, lr: int, replacement: int = 0) -> WorkerSpec:
        """Local rank ``lr``'s process of ``attempt`` (``replacement``: the n-th started in its place,
        with an error file of its own; its log files are the rank's, appended to)."""
        c = self.config
        d = os.path.join(self.job_dir, f"attempt_{attempt}", str(lr))
        os.makedirs(d, exist_ok=True)
        error_dir = os.path.join(d, f"replacement_{replacement}") if replacement else d
        os.makedirs(error_dir, exist_ok=True)
        files = c.redirect_of(lr) | c.tee_of(lr)
        rank = rnd.rank_offset + lr
        error_file = os.path.join(error_dir, "error.json")
        return WorkerSpec(
            rank=rank,
            local_rank=lr,
            argv=child_argv(c),
            env=rank_env(c, rnd, lr, secret, error_file, attempt, replacement),
            stdout=os.path.join(d, "stdout.log") if files & STDOUT else None,
            stderr=os.path.join(d, "stderr.log") if files & STDERR else None,
            tee_stdout=bool(c.tee_of(lr) & STDOUT),
            tee_stderr=bool(c.tee_of(lr) & STDERR),
            console=c.on_console(lr),
            prefix=format_prefix(c.prefix_template, rank, lr),
            error_file=error_file,
            replacement=replacement,
        )

    # ------------------------------------------------------------ run
    def run(self) -> AgentResult:
        c = self.config
        self._install_signals()
        subreaper = self.adopt_orphans and set_child_subreaper(True)
        rdzv = None
        result = GroupResult("failed")
        attempt = 0
        secret = None
        try:
            secret = _job_secret(c)
            self.job_dir = self._make_job_dir()
            if self._keep_dir:
                log.info("rank logs and error files of this job are in %s", self.job_dir)
            if c.bind_cpus:
                log.debug("--bind-to %s: local ranks 0..%d on CPUs %s", c.bind_to, c.nproc_per_node - 1,
                          " | ".join(map(cpu_text, c.bind_cpus)))
            rdzv = make_rendezvous(c, secret, self._wake_w)
            while True:
                self._raise_on_signal = True
                self._check_pending_signal()
                rnd = rdzv.next_round(attempt)
                group = WorkerGroup(self._specs(rnd, attempt, secret), c.term_timeout, self._wake_r, subreaper)
                self._raise_on_signal = False
                group.start()
                try:
                    rdzv.serve()
                except BaseException:
                    group.abort()
                    raise
                ends = EndNotices(rdzv.store_opener(), attempt, group.host, rnd.world_size)
                try:
                    result = group.monitor(self._on_loss(rdzv, attempt, ends) if c.keep_going else None,
                                           on_exit=ends.tell,
                                           replace=self._replace(rnd, attempt, secret, ends, group)
                                           if c.replacing else None,
                                           on_replaced=lambda f: rdzv.report_replacement(attempt, f))
                    self._ended_before_join(ends, result, rdzv, attempt)
                finally:
                    ends.close()
                self._raise_on_signal = True
                _remove_job_files(secret, everything=False)  # the ranks are gone: their files go too
                if c.keep_going and result.state != "interrupted":
                    self._raise_on_signal = False  # settle() polls for signals between its store calls
                    outcome = rdzv.settle(attempt, result, self._check_pending_signal)
                    self._raise_on_signal = True
                    if outcome.state == "interrupted":
                        origin = f"on node {outcome.node}" if outcome.node is not None else None
                        stopped = GroupResult("interrupted", signal=outcome.signal, origin=origin)
                        return AgentResult(outcome.exit_status, stopped, attempt + 1, self._kept_dir())
                    if outcome.state == "succeeded" or attempt >= c.group_restarts:
                        return AgentResult(outcome.exit_status, result, attempt + 1, self._kept_dir(), outcome)
                    attempt += 1
                    log.warning(
                        "%d of %d ranks lost: fewer than --min-nproc %d can finish; restarting the worker group "
                        "(restart %d of %d)", len(outcome.lost) + len(outcome.gone), outcome.world, c.min_nproc,
                        attempt, c.group_restarts,
                    )
                    continue
                if result.state == "succeeded":
                    rdzv.report_success(attempt)
                    return AgentResult(0, result, attempt + 1, self._kept_dir())
                if result.state == "interrupted":
                    rdzv.report_stop(attempt, result.signal)
                    return AgentResult(128 + result.signal, result, attempt + 1, self._kept_dir())
                if result.state == "failed":
                    rdzv.report_failure(attempt, result.root_cause)
                else:  # stopped because another node failed or was interrupted
                    remote = rdzv.remote_outcome(attempt)
                    if isinstance(remote, tuple):
                        node, sig = remote
                        stopped = GroupResult("interrupted", signal=sig, origin=f"on node {node}")
                        return AgentResult(128 + sig, stopped, attempt + 1, self._kept_dir())
                    if remote is not None:
                        result.failures.insert(0, remote)
                if attempt >= c.max_restarts:
                    root = result.root_cause
                    return AgentResult(root.exit_status if root else 1, result, attempt + 1, self._kept_dir())
                attempt += 1
                root = result.root_cause
                log.warning(
                    "rank %s failed (%s); restarting the worker group (restart %d of %d)",
                    root.rank if root else "?", root.describe_exit() if root else "unknown", attempt, c.max_restarts,
                )
        except _Interrupted as intr:
            self._raise_on_signal = False  # a second signal must not interrupt the stopping
            if rdzv is not None:
                rdzv.report_stop(attempt, intr.signum)
            return AgentResult(128 + intr.signum, GroupResult("interrupted", signal=intr.signum), attempt + 1, self._kept_dir())
        finally:
            self._raise_on_signal = False
            if rdzv is not None:
                rdzv.close()
            self._restore_signals()
            if subreaper:
                set_child_subreaper(False)
            if secret is not None:
                _remove_job_files(secret, everything=c.single_node)
            if self.job_dir is not None and not self._keep_dir:
                shutil.rmtree(self.job_dir, ignore_errors=True)

    def _ended_before_join(self, ends: EndNotices, result: GroupResult, rdzv, attempt: int) -> None:
        """After the monitor: mark the failures of ranks that ended before they joined their first
        ``init_process_group`` (in a job whose ranks join: one did), and count a rank that exited 0
        before it joined as failed (lost, with ``--on-failure continue``) when a rank waited for it
        there (``_ends``); else it finished."""
        for f in result.failures:
            if (not f.before_join and f.rank in ends.ends and ends.before_join(f.rank, _VERDICT_S)
                    and ends.claimed_any(_VERDICT_S)):
                f.before_join = True
        clean = [e for e in ends.ends.values() if e.returncode == 0 and ends.before_join(e.rank, _VERDICT_S)]
        if not clean:
            return
        waited = set(ends.waited_for([e.rank for e in clean], _VERDICT_S))
        for e in clean:
            if e.rank not in waited:
                continue  # no rank needed it: a program that does not join, say
            f = Failure(e.rank, e.local_rank, e.pid, e.host, e.returncode, e.timestamp, before_join=True)
            log.warning("rank %d (local rank %d) exited with exit code 0 before it joined the group "
                        "(init_process_group), and other ranks waited for it there: it counts as failed",
                        f.rank, f.local_rank)
            result.failures.append(f)
            result.ok -= 1
            if self.config.keep_going:
                rdzv.report_loss(attempt, f)  # (its ranks have all ended: whether it says stop is moot)
                if result.state == "succeeded":
                    result.state = "continued"
            elif result.state == "succeeded":
                result.state = "failed"

    def _on_loss(self, rdzv, attempt: int, ends: EndNotices):
        """``--on-failure continue``: the monitor's ``on_loss``: log the lost rank, count it for
        the job; True (stop the ranks) when fewer than ``--min-nproc`` can still finish."""
        def on_loss(f: Failure) -> bool:
            if ends.before_join(f.rank, _VERDICT_S) and ends.claimed_any(_VERDICT_S):  # (in the log and the store)
                f.before_join = True
            log.warning("rank %d (local rank %d) failed: %s; the job continues without it (--on-failure %s)",
                        f.rank, f.local_rank, f.describe_exit(), self.config.on_failure)
            stop = rdzv.report_loss(attempt, f)
            if stop:
                log.warning("fewer than --min-nproc %d ranks can still finish with status 0: stopping the job",
                            self.config.min_nproc)
            return stop

        return on_loss

    def _replace(self, rnd: Round, attempt: int, secret: str, ends: EndNotices, group: WorkerGroup):
        """``--on-failure replace``: the monitor's ``replace``: the spec of a new process in the
        lost rank's place, on this node, while it has been replaced fewer than ``--max-restarts``
        times; None (it is lost, as with ``continue``) after that, when it ended before it
        joined the group (the others' ``init_process_group`` failed for it: no group to grow),
        or, on one node, when no other rank runs any more (nobody is left to admit it)."""
        c = self.config

        def replace_it(f: Failure) -> WorkerSpec | None:
            done = self._replacements.get(f.rank, 0)
            if done >= c.max_restarts:
                log.warning("rank %d is not replaced again: it was replaced %d time(s) already (--max-restarts %d)",
                            f.rank, done, c.max_restarts)
                return None
            if f.replacement == 0 and ends.before_join(f.rank, _VERDICT_S) and ends.claimed_any(_VERDICT_S):
                return None  # (the monitor's on_loss names it; the others' init_process_group failed)
            if c.single_node and not any(w.returncode is None for w in group.workers if w.spec.rank != f.rank):
                log.warning("rank %d is not replaced: no other rank of the job runs any more", f.rank)
                return None
            n = self._replacements[f.rank] = done + 1
            spec = self._spec(rnd, attempt, secret, f.local_rank, n)
            log.warning("rank %d (local rank %d) failed: %s; starting a replacement (%d of --max-restarts %d)",
                        f.rank, f.local_rank, f.describe_exit(), n, c.max_restarts)
            return spec

        return replace_it

    def _check_pending_signal(self) -> None:
        try:
            data = os.read(self._wake_r, 64)
        except BlockingIOError:
            return
        for b in data:
            if b:
                raise _Interrupted(b)

    def _kept_dir(self) -> str | None:
        return self.job_dir if self._keep_dir else None


def _remove_job_files(secret: str, everything: bool) -> None:
    """Unlink the job's shared-memory files on this host once its ranks are gone, whatever
    ended them (a rank unlinks its own at exit and on SIGTERM, not on SIGKILL).

    ``everything``: the secret is this launcher's own (single node), so every file of
    the job is ours. Otherwise the secret may be shared with other jobs or with another
    node's launcher on this host: only files whose owner process is dead go."""
    try:
        from ndist.runtime._shmfiles import job_prefix, sweep_dead, unlink_prefix
    except ImportError:  # pragma: no cover - a partial installation: nothing was created
        return
    job = job_prefix(secret)
    n = unlink_prefix(job + "-") if everything else sweep_dead(job)
    if n:
        log.info("removed %d shared-memory file(s) the ranks of this job left in /dev/shm", n)


def _job_secret(config: LaunchConfig) -> str:
    if config.single_node:
        return os.urandom(32).hex()  # = secrets.token_hex(32), without importing hmac/hashlib
    secret = os.environ.get("NDIST_SECRET", "")
    if not secret:
        raise LaunchError(
            f"a {config.nnodes}-node job needs a job secret shared by every node: set NDIST_SECRET to the same "
            "value on all of them, e.g. export NDIST_SECRET=$(python -c 'import secrets; print(secrets.token_hex(32))')"
        )
    return secret
