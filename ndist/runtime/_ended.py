"""A rank that ended before it joined: the launcher's mark, and what a joining rank makes of it.

``init_process_group`` joins by claiming ``rank/<i>`` in the job's store and waiting for
every other rank's claim (``_rendezvous.join``). A rank that ends before it claims (it
exited, even with status 0, was killed, or its program never started) would leave the
others waiting their whole timeout. The launcher that hosts the store knows at once that
the process ended: it calls ``mark_ended``, which writes a *mark* into the rank's claim key
(one ``compare_set``: it lands only if the rank had not claimed, so it also tells the
launcher whether the rank had joined). A rank waiting in the join, or coming to it later,
reads the mark (``ended_marks``) and raises ``DistRankFailureError`` naming the rank, how
it ended (``exited`` / ``died``, as the member watch says) and its exit code or signal.

Keys, in the join's namespace of the job's first ``init_process_group`` of the attempt
(``ndist/<restart>/0/init``):

* ``ended``: the ranks the launcher marked, ``"<rank>,"`` each, appended *before* the mark
  itself, so a join that the mark completes finds it listed;
* ``rank/<r>``: the rank's claim (``host:pid:hex``) or the mark (a JSON object: ``{...}``);
* ``waited/<r>``: set by a rank whose join found ``r``'s mark: some rank waited for it (the
  launcher then counts a rank that exited 0 before joining as a failure, not as finished).
"""

from __future__ import annotations

import json

from ._errors import DIED, EXITED, DistRankFailureError
from .store import PrefixStore, Store

__all__ = ["job_namespace", "JOIN_NAMESPACE", "marks_store", "mark_ended", "waited_for", "claimed_any",
           "ended_marks", "raise_for_marks"]

#: the namespace of the join inside a job namespace (``job_namespace``)
JOIN_NAMESPACE = "init"


def job_namespace(restart_count: int, init_count: int) -> str:
    """The store prefix of one ``init_process_group`` round of one launcher attempt."""
    return f"ndist/{restart_count}/{init_count}"


def marks_store(store: Store, restart_count: int) -> Store:
    """Where the launcher lays its marks in the job's ``store``: the join's namespace of the
    attempt's first ``init_process_group`` (the one a rank that never started misses). A join
    in another namespace (torch's ``ndist://`` rendezvous) reads the marks here (``join``'s
    ``marks``)."""
    return PrefixStore(JOIN_NAMESPACE, PrefixStore(job_namespace(restart_count, 0), store))



def mark_ended(store: Store, restart_count: int, rank: int, *, host: str, pid: int, returncode: int,
               how: str) -> bool:
    """The launcher: rank ``rank`` of attempt ``restart_count`` ended (``returncode``: its exit
    status, negative for a signal; ``how``: "exit code 0", "killed by SIGKILL"). True when it
    had not joined its first ``init_process_group``: the mark is laid, and the ranks that wait
    for it raise. False when it had joined (its claim stays)."""
    join = marks_store(store, restart_count)
    join.append("ended", f"{rank},")  # (before the mark: see the module docstring)
    mark = json.dumps({"rank": rank, "host": host, "pid": pid, "returncode": returncode,
                       "cause": DIED if returncode < 0 else EXITED, "how": how}).encode()
    return join.compare_set(f"rank/{rank}", b"", mark) == mark


def waited_for(store: Store, restart_count: int, ranks) -> list[int]:
    """The launcher: those of ``ranks`` (marked by ``mark_ended``) that a joining rank found."""
    join = marks_store(store, restart_count)
    return [r for r in ranks if join.check([f"waited/{r}"])]


def claimed_any(store: Store, restart_count: int, world_size: int) -> bool:
    """The launcher: whether any rank of the ``world_size`` claimed its rank in its first
    ``init_process_group`` (its program joins groups: a rank that ended before it joined
    matters). Never waits."""
    join = marks_store(store, restart_count)
    for r in range(world_size):
        key = f"rank/{r}"
        if join.check([key]) and join.get(key)[:1] != b"{":
            return True
    return False


def ended_marks(join: Store, rank: int, world_size: int) -> dict[int, dict]:
    """In ``join`` (the join's namespace): the marks of the ranks below ``world_size`` other
    than ``rank``, by rank (none without a launcher, or when no rank ended before it joined).
    Never waits."""
    if not join.check(["ended"]):
        return {}
    listed = {int(r) for r in join.get("ended").decode().split(",") if r.strip()}
    listed = sorted(r for r in listed if r != rank and 0 <= r < world_size)
    marks = {}
    for r in listed:
        key = f"rank/{r}"
        if not join.check([key]):  # (listed a moment before its mark lands)
            continue
        value = join.get(key)
        if value[:1] == b"{":
            marks[r] = json.loads(value)
    return marks


def raise_for_marks(join: Store, rank: int, world_size: int, marks: dict[int, dict]) -> None:
    """``rank`` found ``marks`` in its join: say so in the store (``waited_for``), then raise
    the ``DistRankFailureError`` naming each rank (a death first, as the member watch orders)."""
    join.multi_set([f"waited/{r}" for r in marks], [str(rank)] * len(marks))
    order = sorted(marks, key=lambda r: (marks[r].get("cause") != DIED, r))
    hosts = [str(marks[r].get("host", "?")) for r in order]
    causes = [str(marks[r].get("cause", EXITED)) for r in order]
    said = "; ".join(f"rank {r} ({h}) {c} before it joined the group ({marks[r].get('how', '?')}, seen by the launcher)"
                     for r, h, c in zip(order, hosts, causes))
    them = "it" if len(order) == 1 else "them"
    raise DistRankFailureError(
        f"init_process_group on rank {rank}: {said}. The group of {world_size} ranks cannot be made without {them}",
        failed_ranks=sorted(order), hosts=[hosts[order.index(r)] for r in sorted(order)],
        causes=[causes[order.index(r)] for r in sorted(order)], rank=order[0], host=hosts[0])
