"""The failure summary ``ndistrun`` prints on stderr when a job fails (torchrun's report)."""

from __future__ import annotations

import os

from ._workers import Failure, GroupResult, signal_name

__all__ = ["format_summary"]

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
