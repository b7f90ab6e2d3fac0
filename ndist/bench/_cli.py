"""``ndist-bench`` entry point."""

from __future__ import annotations

import logging
import os
import sys

from ._config import parse_args
from ._launch import BenchError
from ._report import format_report, to_json
from ._runner import Row, run_bench

__all__ = ["main"]


def _progress(row: Row) -> None:
    sys.stderr.write(f"# {row.op:<14} {row.lib:<13} {row.size:>11} B  {row.time_us:>10.2f} us  "
                     f"busbw {row.busbw:8.3f} GB/s\n")
    sys.stderr.flush()


def check_outputs(cfg) -> None:
    """``ValueError`` for an output that could only fail after the whole run: a missing
    directory, ``--plot`` without matplotlib or without an op that moves bytes."""
    for name, path in (("json", cfg.json_path), ("markdown", cfg.markdown_path), ("plot", cfg.plot_path)):
        if path:
            folder = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(folder):
                raise ValueError(f"{name}: the directory {folder!r} of {path!r} does not exist")
    if cfg.plot_path:
        from ._plot import require_matplotlib

        require_matplotlib()
        if all(op == "barrier" for op in cfg.ops):
            raise ValueError("plot: barrier moves no bytes: nothing to plot against size; add an op or drop --plot")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark described by ``argv`` (``sys.argv[1:]`` by default).

    Exit status: 0, 1 when a result was wrong, 2 for bad arguments, 3 when a
    library failed or timed out.
    """
    full = sys.argv if argv is None else ["ndist-bench", *argv]
    cfg = parse_args(full[1:])
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        check_outputs(cfg)
        res = run_bench(cfg, progress=None if cfg.quiet else _progress)
    except ValueError as e:
        sys.stderr.write(f"ndist-bench: error: {e}\n")
        return 2
    except BenchError as e:
        sys.stderr.write(f"ndist-bench: {e}\n")
        return 3
    sys.stdout.write(format_report(res, full))
    sys.stdout.flush()
    if cfg.json_path:
        with open(cfg.json_path, "w") as f:
            f.write(to_json(res, full) + "\n")
    if cfg.markdown_path:
        from ._markdown import format_markdown

        with open(cfg.markdown_path, "w") as f:
            f.write(format_markdown(res))
    if cfg.plot_path:
        from ._plot import plot

        try:
            plot(res, cfg.plot_path)
        except ValueError as e:
            sys.stderr.write(f"ndist-bench: error: {e}\n")
            return 2
    return 1 if any(r.wrong > 0 for r in res.rows) else 0
