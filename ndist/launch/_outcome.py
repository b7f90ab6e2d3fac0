"""``--on-failure continue``: the job-wide outcome of an attempt and the ``--min-nproc`` rule.

With ``continue`` a rank that fails is *lost*: the others run on. The job (all
nodes together) succeeds once at least ``--min-nproc`` ranks have finished with
status 0, and fails as soon as fewer than ``--min-nproc`` ranks can still do so
(``world - lost < min_nproc``); the two cannot both happen, since the ranks that
finished with 0 and the lost ones are disjoint. The rendezvous (``_rdzv``) keeps
the tally: in memory on one node, in the job's store across nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ._workers import Failure

__all__ = ["JobOutcome", "too_few_left"]


def too_few_left(world: int, lost: int, min_nproc: int) -> bool:
    """True once fewer than ``min_nproc`` of the ``world`` ranks can still finish with status 0."""
    return world - lost < min_nproc


@dataclass
class JobOutcome:
    """How an attempt of a ``continue`` job ended, for the whole job (every node)."""

    state: str  # "succeeded" | "failed" | "interrupted"
    world: int  # ranks in the job
    min_nproc: int
    ok: int = 0  # ranks known to have finished with status 0 when the outcome was decided
    lost: list[Failure] = field(default_factory=list)  # every lost rank known, by rank
    gone: list[int] = field(default_factory=list)  # ranks of nodes whose agent vanished, counted as lost
    #: ``--on-failure replace``: every loss a new process was started for, by rank then replacement
    replaced: list[Failure] = field(default_factory=list)
    signal: int | None = None  # "interrupted": the signal, and the node that got it
    node: int | None = None
    note: str | None = None  # why the outcome is uncertain (the store was lost)

    @property
    def root_cause(self) -> Failure | None:
        return min(self.lost, key=lambda f: (f.timestamp, f.rank)) if self.lost else None

    @property
    def exit_status(self) -> int:
        """0 when succeeded; 128 + signal when interrupted; else the first lost rank's status (1 without one)."""
        if self.state == "succeeded":
            return 0
        if self.state == "interrupted":
            return 128 + (self.signal or 0)
        root = self.root_cause
        return root.exit_status if root is not None else 1
