"""ndistrun: start the ranks of a job on this node (torchrun's counterpart).

``ndistrun --nproc-per-node 4 train.py`` or ``python -m ndist.launch ...``;
see ``docs/launch.md`` for every option and the environment each rank gets.
The launcher imports ``ndist.runtime`` only, and only what it uses, when it
uses it: importing this package is cheap (ranks import it to bootstrap).
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``ndistrun``: run with ``argv`` and return the exit status."""
    from ._cli import main as _main

    return _main(argv)
