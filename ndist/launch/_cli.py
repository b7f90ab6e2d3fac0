"""``ndistrun`` / ``python -m ndist.launch``: parse, run the agent, report, exit status."""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["main", "run"]


def _configure_logging() -> None:
    level = os.environ.get("NDIST_DEBUG", "").upper()
    root = logging.getLogger("ndist")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[ndistrun] %(levelname)s: %(message)s"))
        root.addHandler(handler)
    if level in ("DETAIL", "DEBUG"):
        root.setLevel(logging.DEBUG)
    elif level == "INFO":
        root.setLevel(logging.INFO)
    else:
        root.setLevel(logging.WARNING)
        logging.getLogger("ndist.launch").setLevel(logging.INFO)


def run(argv: list[str] | None = None, *, _command: bool = False) -> int:
    """Run ``ndistrun`` with ``argv`` (default ``sys.argv[1:]``); return the exit status.

    0 when every rank succeeded (with ``--on-failure continue``: when at least
    ``--min-nproc`` ranks did); the first failing rank's exit code (128 +
    signal number when it was killed by a signal); 128 + signal when the
    launcher itself was interrupted; 2 for bad arguments (the message is on
    stderr) or a job that cannot start.
    """
    from ._config import parse_args

    try:
        config = parse_args(argv)
    except SystemExit as exc:  # argparse: --help, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else 2
    _configure_logging()
    from ._agent import Agent, LaunchError
    from ._summary import format_continue_summary, format_summary

    try:
        out = Agent(config, adopt_orphans=_command).run()
    except LaunchError as err:
        sys.stderr.write(f"ndistrun: error: {err}\n")
        return 2
    what = ("-m " if config.module else "") + config.entrypoint
    o = out.outcome
    if o is not None and (o.state != "succeeded" or o.lost or o.gone or o.replaced):
        sys.stderr.write(format_continue_summary(what, o, out.attempts, config.group_restarts, out.log_dir,
                                                 config.on_failure, config.max_restarts) + "\n")
    elif out.exit_status != 0:
        sys.stderr.write(format_summary(what, out.result, out.attempts, config.group_restarts, out.log_dir) + "\n")
    return out.exit_status


def main(argv: list[str] | None = None) -> None:
    """The ``ndistrun`` command: ``run(argv)``, then exit the process with its status.

    As the command, the launcher also adopts processes the ranks started
    outside their process groups (``PR_SET_CHILD_SUBREAPER``) and kills them
    at the end. The interpreter's teardown (freeing every module, NumPy's included) is
    skipped once output is flushed: every rank is gone and every file closed
    by then, and it would only delay the shell. Use ``run()`` to get the
    status back instead.
    """
    status = run(argv, _command=True)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)
