"""Collective schedules, the one entry: which algorithm an op runs (``choose``) and this
rank's schedule of it (``schedule``, cached), flat (``_flat``, where the records and
their layout are described) or two-level (``_twolevel``, for a group on several hosts).

Every schedule does no I/O, so the same records run on the Python engine
(``_run``), in the simulator (``_simulate``) and on the native engine.
"""

from __future__ import annotations

import functools

from ._flat import (A2A_BRUCK_MAX, ALGOS, BUF, COPY, DIRECT_MAX_RANKS, IN, INP, INS, OUT, OUTS, REDUCE,
                    REDUCE_REV, SMALL_MAX, TMP, Copy, Recv, Round, Schedule, Send, subtree)
from . import _flat
from ._twolevel import OPS as TWO_LEVEL_OPS
from ._twolevel import two_level

__all__ = [
    "COPY", "REDUCE", "REDUCE_REV", "BUF", "INP", "TMP", "OUTS", "INS", "OUT", "IN",
    "Send", "Recv", "Copy", "Round", "Schedule", "schedule", "choose", "ALGOS", "SMALL_MAX", "A2A_BRUCK_MAX",
    "DIRECT_MAX_RANKS", "subtree", "TWO_LEVEL", "TWO_LEVEL_OPS", "spans_hosts",
]

#: the algorithm name of every two-level schedule (``_twolevel.py``); its ops: ``TWO_LEVEL_OPS``
TWO_LEVEL = "two_level"


def spans_hosts(topo) -> bool:
    """More than one host, and at least one host with more than one rank (with one
    rank per host, two levels are the flat algorithm): ``choose``'s test."""
    nh = max(topo) + 1 if topo else 0
    return 1 < nh < len(topo)


@functools.lru_cache(maxsize=4096)
def schedule(op: str, algo: str, item: int, sizes: tuple, n: int, rank: int, root: int = 0,
             topo=None) -> Schedule:
    """This rank's schedule of ``op`` by ``algo``.

    ``sizes`` (elements): ``(count,)`` for all_reduce / reduce / broadcast; one
    count per rank for reduce_scatter (its inputs), all_gather, gather and
    scatter; ``(ins, outs)`` (per-peer counts) for all_to_all; ``()`` for barrier.
    ``topo``: the host index of every rank (``_twolevel.topology``); only the
    ``two_level`` algorithm reads it (``None``: one flat level).
    """
    if algo != TWO_LEVEL:
        return _flat.schedule(op, algo, item, sizes, n, rank, root)
    if not 0 <= rank < n:
        raise ValueError(f"rank: expected 0 <= rank < {n}, got {rank}")
    if topo is None:
        raise ValueError("topo: expected the host index of every rank for a two-level schedule, got None")
    return two_level(op, item, sizes, n, rank, root, topo)


def choose(op: str, nbytes: int, n: int, count: int = 0, force: str = "auto", topo=None,
           even: bool = False) -> str | None:
    """The algorithm for ``op`` moving ``nbytes`` (all_reduce: the buffer; ``count``
    its elements; all_to_all: one block) in a group of ``n``: ``None`` keeps the
    direct one-step exchange. Depends only on its arguments, so every rank chooses
    alike: ``even`` (all_to_all) says that every block of every rank is ``nbytes``,
    which only the even form (``all_to_all_single`` without split sizes) promises;
    a rank of any other all_to_all knows its own sizes only, and stays pairwise. ``force``:
    ``direct`` / ``sched`` / ``flat`` / ``auto`` (``NDIST_ALGO``). ``topo`` (the
    host index of every rank): a group on more than one host, with some host
    holding several ranks, runs ``two_level`` for the ops that have it (not with
    ``direct`` or ``flat``: ``flat`` is ``auto`` as if every rank were on one host)."""
    if force == "direct" or n <= 1:
        return None
    if force != "flat" and topo is not None and op in TWO_LEVEL_OPS and spans_hosts(topo):
        return TWO_LEVEL
    return _flat.choose(op, nbytes, n, count, force, even)
