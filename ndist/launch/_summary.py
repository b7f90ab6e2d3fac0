"""The summary ``ndistrun`` prints on stderr when a job fails (torchrun's report), or,
with ``--on-failure continue``, when it lost ranks on the way."""

from __future__ import annotations

import os

from ._outcome import JobOutcome
from ._workers import Failure, GroupResult, signal_name

__all__ = ["format_summary", "format_continue_summary"]

_RULE = "=" * 72


def _show_all_frames() -> bool:
    """``NDIST_DEBUG=INFO`` (or DETAIL / DEBUG): the ranks' full tracebacks, frames inside ndist included.
    Otherwise the rank's short traceback (its error file keeps the full one)."""
    return os.environ.get("NDIST_DEBUG", "").strip().upper() in ("INFO", "DETAIL", "DEBUG")


def _indent(text: str, pad: str) -> str:
    return "\n".join(pad + line for line in text.rstrip("\n").splitlines())


def _root_lines(f: Failure, show_error_file: bool) -> list[str]:
    lines = [
        f"  rank       : {f.rank} (local rank {f.local_rank})",
        f"  host       : {f.host}",
        f"  pid        : {f.pid}",
        f"  exit       : {f.describe_exit()}",
    ]
    rec = f.record if isinstance(f.record, dict) else None
    if show_error_file and f.error_file and rec is not None:
        lines.append(f"  error file : {f.error_file}")
    text = rec and (rec.get("traceback") if _show_all_frames() else rec.get("short_traceback") or rec.get("traceback"))
    if text:
        lines.append("  traceback  :")
        lines.append(_indent(str(text), "    "))
    elif f.returncode < 0:
        lines.append(f"  traceback  : none (the rank was killed by {signal_name(-f.returncode)} before it could write one)")
    else:
        lines.append("  traceback  : none (the rank exited without an unhandled Python exception)")
    return lines


def format_summary(what: str, result: GroupResult, attempts: int, max_restarts: int, log_dir: str | None) -> str:
    """The report for a job that did not succeed."""
    if result.state == "interrupted":
        sig = signal_name(result.signal) if result.signal else "a signal"
        where = f" {result.origin}" if result.origin else ""
        return f"ndistrun: {what} interrupted by {sig}{where}: every rank was stopped"
    root = result.root_cause
    out = [_RULE, f"ndistrun: {what} FAILED (attempt {attempts} of {max_restarts + 1})", "-" * 72]
    if root is None:
        out.append("root cause: unknown (no rank reported a failure)")
    else:
        out.append("root cause (first rank to fail):")
        out.extend(_root_lines(root, log_dir is not None))
        others = [f for f in result.failures if f is not root]
        if others:
            out.append("other failures:")
            out.extend(f"  rank {f.rank} on {f.host}: {f.describe_exit()}" for f in sorted(others, key=lambda f: f.rank))
    if log_dir is not None:
        out.append(f"logs: {log_dir}")
    out.append(_RULE)
    return "\n".join(out)


def _replaced_lines(o: JobOutcome, replacements: int, log_dir: str | None) -> list[str]:
    """``--on-failure replace``: one entry per loss a new process was started for."""
    out = []
    for f in o.replaced:
        by = f", pid {f.replaced_by}" if f.replaced_by is not None else ""
        out.append(f"replaced rank {f.rank} (replacement {f.replacement + 1} of --max-restarts {replacements}{by}); "
                   "the lost process:")
        out.extend(_root_lines(f, log_dir is not None))
    return out


def format_continue_summary(what: str, outcome: JobOutcome, attempts: int, max_restarts: int, log_dir: str | None,
                            on_failure: str = "continue", replacements: int = 0) -> str:
    """The report of a ``--on-failure continue`` (or ``replace``) job that lost ranks, replaced
    some, or failed: every lost rank (host, exit or signal, traceback), every replaced one, and
    whether at least ``--min-nproc`` ranks finished with 0. ``max_restarts``: the whole job's
    restarts; ``replacements``: ``--max-restarts`` of ``replace`` (per rank)."""
    o = outcome
    n_lost = len(o.lost) + len(o.gone)
    ranks = "rank" if n_lost == 1 else "ranks"
    rule = f"{o.ok} of {o.world} ranks finished with status 0 (--min-nproc {o.min_nproc})"
    if o.state == "succeeded":
        n_rep = len(o.replaced)
        head = (f"finished without {n_lost} lost {ranks}" if n_lost else
                f"finished; {n_rep} lost {'process was' if n_rep == 1 else 'processes were'} replaced")
        out = [_RULE, f"ndistrun: {what} {head} (--on-failure {on_failure})", "-" * 72, f"{rule}: exit status 0"]
        out.extend(_replaced_lines(o, replacements, log_dir))
        for f in o.lost:
            again = f"; replaced {f.replacement} time(s) already, --max-restarts {replacements}" if on_failure == \
                "replace" else ""
            out.append(f"lost rank {f.rank} (the job continued without it{again}):")
            out.extend(_root_lines(f, log_dir is not None))
    else:
        out = [_RULE, f"ndistrun: {what} FAILED (attempt {attempts} of {max_restarts + 1}; --on-failure {on_failure})",
               "-" * 72]
        out.extend(_replaced_lines(o, replacements, log_dir))
        if o.note:
            out.append(f"{o.note}: this node's ranks are listed")
        else:
            out.append(f"{n_lost} of {o.world} ranks lost: fewer than --min-nproc {o.min_nproc} could still finish "
                       "with status 0, so the job was stopped")
        root = o.root_cause
        if root is not None:
            out.append("root cause (first rank to fail):")
            out.extend(_root_lines(root, log_dir is not None))
        for f in o.lost:
            if f is not root:
                out.append(f"also lost: rank {f.rank}")
                out.extend(_root_lines(f, log_dir is not None))
    if o.gone:
        out.append(f"ranks {sorted(o.gone)} counted as lost: the agent of their node vanished before they ended")
    if log_dir is not None:
        out.append(f"logs: {log_dir}")
    out.append(_RULE)
    return "\n".join(out)
