"""``split_group``: sub-groups of a parent group, made by the parent's members only.

Unlike ``new_group`` (which every rank of the job calls, and whose groups are
named by a job-wide counter), only the parent's members call ``split_group``.
Its groups are therefore named after the parent, a per-parent count of splits
and their ranks (``"0:split1:0,2"``), which every member derives alike; each
gets its own store namespace. No communication happens at creation.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Sequence

from ._group import ProcessGroup, parse_backend
from ._timeout import check_timeout
from .store import PrefixStore

__all__ = ["split_group"]

_counts: dict[int, int] = {"init": -1, "created": 0}  # split groups made since the last init


def split_count() -> int:
    """Split groups created since the current ``init_process_group`` (``get_pg_count`` adds them)."""
    from ._world import _world

    return _counts["created"] if _counts["init"] == _world.init_count else 0


def _check_splits(split_ranks: Any, n: int) -> list[list[int]]:
    if split_ranks is None or isinstance(split_ranks, (str, bytes)) or not hasattr(split_ranks, "__len__") \
            or len(split_ranks) == 0:
        raise ValueError(f"split_ranks: expected a non-empty list of lists of group ranks, got {split_ranks!r}")
    seen: set[int] = set()
    splits = []
    for i, sub in enumerate(split_ranks):
        if isinstance(sub, (str, bytes)) or not hasattr(sub, "__iter__"):
            raise TypeError(f"split_ranks[{i}]: expected a list of int, got {type(sub).__name__}")
        sub = list(sub)
        if not sub:
            raise ValueError(f"split_ranks[{i}]: expected at least one rank, got []")
        for r in sub:
            if not isinstance(r, int) or isinstance(r, bool):
                raise TypeError(f"split_ranks[{i}]: expected ranks of type int, got {type(r).__name__}")
            if not 0 <= r < n:
                raise ValueError(f"split_ranks[{i}]: expected ranks of the parent group in [0, {n}), got {r}")
            if r in seen:
                raise ValueError(f"split_ranks[{i}]: rank {r} appears twice (splits must not overlap)")
            seen.add(r)
        splits.append(sorted(sub))
    return splits


def split_group(
    parent_pg: Any = None,
    split_ranks: Sequence[Sequence[int]] | None = None,
    timeout: timedelta | None = None,
    pg_options: Any = None,
    group_desc: str | None = None,
    backend: str | None = None,
) -> ProcessGroup | None:
    """The split of ``parent_pg`` (default: the world) that contains this rank, or
    ``None`` when no split does. ``split_ranks`` lists **group ranks of the parent**;
    every member of the parent calls this with the same ``split_ranks``.
    ``backend`` keeps a subset of the parent's per-device backends (names must match)."""
    from ._world import _world, resolve_group

    with _world.lock:
        parent = resolve_group(parent_pg)
        parent.require_member("split_group")
        splits = _check_splits(split_ranks, parent.size())
        mapping = parent.backend_names
        if backend is not None:
            wanted = parse_backend(str(backend))
            for dev, name in wanted.items():
                if mapping.get(dev) != name:
                    raise ValueError(f"backend: {dev}:{name} is not a backend of the parent group "
                                     f"(it has {parent.backend_name()!r})")
            mapping = wanted
        timeout = check_timeout(timeout, parent.timeout)
        count = getattr(parent, "_split_calls", 0) + 1
        parent._split_calls = count  # every member calls split_group on the parent in the same order
        if _counts["init"] != _world.init_count:
            _counts.update(init=_world.init_count, created=0)
        mine = next((s for s in splits if parent.rank() in s), None)
        if mine is None:
            return None
        ranks = tuple(parent.ranks[r] for r in mine)
        name = f"{parent.group_name}:split{count}:{','.join(map(str, ranks))}"
        pg = ProcessGroup(ranks, parent._global_rank, name, PrefixStore(name, _world.job_store), mapping, timeout,
                          pg_options if pg_options is not None else parent.options)
        pg.group_desc = group_desc or f"{parent.group_desc}:split:{count}"
        pg.device_id = parent.device_id
        pg.numbering = _world.numbering
        _world.groups[name] = pg
        _counts["created"] += 1
        for grank, (host, cause, detail) in list(_world.lost.items()):  # revoked from the start, as new_group's
            pg.note_loss(grank, host, cause, detail)
        _world.revoke_told(pg)
        return pg
