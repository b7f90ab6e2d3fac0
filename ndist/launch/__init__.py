"""ndistrun: start the ranks of a job on this node (torchrun's counterpart).

``ndistrun --nproc-per-node 4 train.py`` or ``python -m ndist.launch ...``;
see ``docs/launch.md`` for every option and the environment each rank gets.
The launcher imports ``ndist.runtime`` only, and only what it uses, when it
uses it: importing this package is cheap (ranks import it to bootstrap).
"""

from __future__ import annotations

__all__ = ["main", "run"]


def main(argv: list[str] | None = None) -> None:
    """The ``ndistrun`` command: run with ``argv`` (default: the command line) and exit
    the process with the job's exit status."""
    from ._cli import main as _main

    _main(argv)


def run(argv: list[str] | None = None) -> int:
    """Run ``ndistrun`` with ``argv`` and return the exit status (for use from Python)."""
    from ._cli import run as _run

    return _run(argv)
