"""Collective schedules, the one entry: which algorithm an op runs (``choose``, defined in
``_flat``) and this rank's schedule of it (``schedule``, cached), flat (``_flat``, where the
records and their layout are described) or two-level (``_twolevel``, for a group on
several hosts).

Every schedule does no I/O, so the same records run on the Python engine
(``_run``), in the simulator (``_simulate``) and on the native engine.
"""

from __future__ import annotations

import functools

from ._flat import (A2A_BRUCK_MAX, ALGOS, BUF, COPY, DIRECT_MAX_RANKS, IN, INP, INS, OUT, OUTS, REDUCE,
                    REDUCE_REV, SMALL_MAX, TMP, TWO_LEVEL, TWO_LEVEL_OPS, Copy, Recv, Round, Schedule, Send, choose,
                    spans_hosts, subtree)
from . import _flat
from ._twolevel import two_level

__all__ = [
    "COPY", "REDUCE", "REDUCE_REV", "BUF", "INP", "TMP", "OUTS", "INS", "OUT", "IN",
    "Send", "Recv", "Copy", "Round", "Schedule", "schedule", "choose", "ALGOS", "SMALL_MAX", "A2A_BRUCK_MAX",
    "DIRECT_MAX_RANKS", "subtree", "TWO_LEVEL", "TWO_LEVEL_OPS", "spans_hosts",
]

@functools.lru_cache(maxsize=4096)
def schedule(op: str, algo: str, item: int, sizes: tuple, n: int, rank: int, root: int = 0,
             topo=None) -> Schedule:
    """This rank's schedule of ``op`` by ``algo``.

    ``sizes`` (elements): ``(count,)`` for all_reduce / reduce / broadcast; one
    count per rank for reduce_scatter (its inputs), all_gather, gather and
    scatter; ``(ins, outs)`` (per-peer counts) for all_to_all; ``()`` for barrier.
    ``topo``: the host index of every rank (``wire/_links.topology``); only the
    ``two_level`` algorithm reads it (``None``: one flat level).
    """
    if algo != TWO_LEVEL:
        return _flat.schedule(op, algo, item, sizes, n, rank, root)
    if not 0 <= rank < n:
        raise ValueError(f"rank: expected 0 <= rank < {n}, got {rank}")
    if topo is None:
        raise ValueError("topo: expected the host index of every rank for a two-level schedule, got None")
    return two_level(op, item, sizes, n, rank, root, topo)
