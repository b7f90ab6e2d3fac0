"""Flat collective schedules: what one rank sends, receives and reduces, round by round
(one level: every rank a peer of every other; the records every schedule is made of).

An algorithm is a pure function of (op, algorithm, item size, sizes, group size,
rank, root, topology) that returns this rank's ``Schedule``; it does no I/O, so
the same records run on the Python engine (``engine/_scheduled.py``), in the simulator
(``_simulate.py``) and, later, in the native engine. Schedules are cached
(``schedule()``, an ``lru_cache``): a repeated call costs a dictionary lookup.

Layout (everything is a tuple of ints; offsets and lengths are in **bytes**, and
every region a ``Recv`` reduces covers whole elements of the op's dtype)::

    Schedule(algo, rounds, pre, post, tmp)   tmp: bytes of scratch (buffer TMP)
    Round(sends, recvs, pre, post)           one engine step; rounds are global:
                                             round t of every rank matches round t
                                             of its peers (its frames carry step t)
    Send(peer, buf, off, nbytes)             bytes read when the round starts
    Recv(peer, buf, off, nbytes, mode)       COPY: the bytes land in buf[off:off+nbytes]
                                             REDUCE: dst = dst (op) message
                                             REDUCE_REV: dst = message (op) dst
    Copy(src, src_off, dst, dst_off, nbytes) local copies: the schedule's ``pre`` before
                                             round 0 and ``post`` after the last round;
                                             a round's ``pre`` before its sends are read
                                             (e.g. to pack scattered blocks into one
                                             message), its ``post`` after its receives
                                             landed and its reductions ran (to unpack)

Buffers: ``BUF`` the op's in-place buffer or single output; ``INP`` its single
input; ``TMP`` scratch; ``OUTS`` / ``INS`` the concatenation, in rank order, of
the output / input list (only ``Copy`` names them: the executor splits the copy
over the list's arrays); ``OUT + j`` / ``IN + j`` the list's entry ``j``.

Rules every schedule keeps (the simulator checks them): per round at most one
send and one receive per peer; a COPY receive never overlaps a send of the same
round (the engine may write it while the send is still going out); a copy's
source and destination never overlap (a plain memcpy does); reductions are
applied after all of the round's messages arrived, in list order; a zero-byte
message is a header-only frame ("ticket": the receiving side of a rooted op
answers its sender, so a mismatched call is seen by both sides). What an engine
keeps: a round ends only when its sends have been read (the next round's copies
may overwrite their bytes, as Bruck all_to_all's staging area is).

Reductions are deterministic and the same on every rank: in recursive doubling
both partners compute (lower block) op (upper block); in the reduce-scatter
phases each block is reduced exactly once, on one rank, and then copied.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

__all__ = [
    "COPY", "REDUCE", "REDUCE_REV", "BUF", "INP", "TMP", "OUTS", "INS", "OUT", "IN",
    "Send", "Recv", "Copy", "Round", "Schedule", "schedule", "choose", "ALGOS", "SMALL_MAX", "A2A_BRUCK_MAX",
    "DIRECT_MAX_RANKS", "subtree", "TWO_LEVEL", "TWO_LEVEL_OPS", "spans_hosts",
]

COPY, REDUCE, REDUCE_REV = 0, 1, 2
BUF, INP, TMP, OUTS, INS = 0, 1, 2, 3, 4
OUT, IN = 1 << 20, 2 << 20

#: groups of at most this many ranks keep the direct (one-step) algorithms
DIRECT_MAX_RANKS = 4
#: all_reduce up to this many bytes: recursive doubling; above: reduce-scatter + all-gather
SMALL_MAX = 256 << 10
#: an even all_to_all with blocks up to this many bytes: Bruck; above (or uneven): pairwise.
#: Measured on the Python engine, one host (docs/socket.md): at 8 ranks Bruck wins
#: with 4 KiB blocks and loses with 8 KiB ones, at 5 ranks the two are about even up to 13 KiB
A2A_BRUCK_MAX = 4 << 10


class Send(NamedTuple):
    peer: int
    buf: int
    off: int
    nbytes: int


class Recv(NamedTuple):
    peer: int
    buf: int
    off: int
    nbytes: int
    mode: int = COPY


class Copy(NamedTuple):
    src: int
    src_off: int
    dst: int
    dst_off: int
    nbytes: int


class Round(NamedTuple):
    sends: tuple = ()
    recvs: tuple = ()
    pre: tuple = ()  # Copy records run before the sends are read
    post: tuple = ()  # Copy records run after the receives and reductions


class Schedule(NamedTuple):
    algo: str
    rounds: tuple
    pre: tuple = ()
    post: tuple = ()
    tmp: int = 0

    @property
    def active_rounds(self) -> int:
        """Rounds in which this rank sends or receives anything."""
        return sum(1 for r in self.rounds if r.sends or r.recvs)


_IDLE = Round()


def _log2(n: int) -> int:
    """ceil(log2 n)."""
    return (n - 1).bit_length()


def _bounds(sizes, item: int) -> list:
    """Byte offsets of consecutive blocks of ``sizes`` elements."""
    out = [0]
    for s in sizes:
        out.append(out[-1] + s * item)
    return out


def _even(count: int, n: int) -> tuple:
    return tuple(count * (i + 1) // n - count * i // n for i in range(n))


# ------------------------------------------------------------------ all_reduce
def _rd_all_reduce(nb: int, n: int, r: int) -> Schedule:
    """Recursive doubling; a non-power of two first folds ranks 2i into 2i+1 (i < rem)
    and unfolds them at the end: floor(log2 n) rounds, + 2 with the fold."""
    p = 1 << (n.bit_length() - 1)
    rem = n - p
    rounds = []
    if r < 2 * rem:
        new = r // 2 if r % 2 else -1
    else:
        new = r - rem

    def real(v):
        return 2 * v + 1 if v < rem else v + rem

    if rem:
        if r < 2 * rem:
            rounds.append(Round((Send(r + 1, BUF, 0, nb),), ()) if r % 2 == 0
                          else Round((), (Recv(r - 1, BUF, 0, nb, REDUCE_REV),)))
        else:
            rounds.append(_IDLE)
    mask = 1
    while mask < p:
        if new >= 0:
            q = real(new ^ mask)
            mode = REDUCE if new < new ^ mask else REDUCE_REV
            rounds.append(Round((Send(q, BUF, 0, nb),), (Recv(q, BUF, 0, nb, mode),)))
        else:
            rounds.append(_IDLE)
        mask <<= 1
    if rem:
        if r < 2 * rem:
            rounds.append(Round((Send(r - 1, BUF, 0, nb),), ()) if r % 2
                          else Round((), (Recv(r + 1, BUF, 0, nb, COPY),)))
        else:
            rounds.append(_IDLE)
    return Schedule("recursive_doubling", tuple(rounds))


def _halving_rs(bb: list, n: int, r: int, buf: int) -> list:
    """Recursive-halving reduce-scatter over blocks ``bb`` (n a power of two): rank r
    ends with block r of ``buf`` fully reduced. log2 n rounds."""
    rounds = []
    mask = n >> 1
    while mask:
        base = r & ~(2 * mask - 1)
        q = r ^ mask
        if r & mask:
            keep, give = (base + mask, base + 2 * mask), (base, base + mask)
        else:
            keep, give = (base, base + mask), (base + mask, base + 2 * mask)
        mode = REDUCE if r < q else REDUCE_REV
        rounds.append(Round((Send(q, buf, bb[give[0]], bb[give[1]] - bb[give[0]]),),
                            (Recv(q, buf, bb[keep[0]], bb[keep[1]] - bb[keep[0]], mode),)))
        mask >>= 1
    return rounds


def _doubling_ag(bb: list, n: int, r: int, buf: int) -> list:
    """Recursive-doubling all-gather of blocks ``bb`` (n a power of two), rank r
    starting with block r. log2 n rounds."""
    rounds = []
    mask = 1
    while mask < n:
        q = r ^ mask
        mine, theirs = r & ~(mask - 1), q & ~(mask - 1)
        rounds.append(Round((Send(q, buf, bb[mine], bb[mine + mask] - bb[mine]),),
                            (Recv(q, buf, bb[theirs], bb[theirs + mask] - bb[theirs], COPY),)))
        mask <<= 1
    return rounds


def _ring_rs(bb: list, n: int, r: int, buf: int) -> list:
    """Ring reduce-scatter: block c is reduced along c+1, c+2, ..., c (in that
    order) and ends on rank c. n-1 rounds."""
    nxt, prv = (r + 1) % n, (r - 1) % n
    rounds = []
    for s in range(n - 1):
        out, got = (r - s - 1) % n, (r - s - 2) % n
        rounds.append(Round((Send(nxt, buf, bb[out], bb[out + 1] - bb[out]),),
                            (Recv(prv, buf, bb[got], bb[got + 1] - bb[got], REDUCE_REV),)))
    return rounds


def _ring_ag(bb: list, n: int, r: int, buf: int) -> list:
    """Ring all-gather, rank r starting with block r. n-1 rounds."""
    nxt, prv = (r + 1) % n, (r - 1) % n
    rounds = []
    for s in range(n - 1):
        out, got = (r - s) % n, (r - s - 1) % n
        rounds.append(Round((Send(nxt, buf, bb[out], bb[out + 1] - bb[out]),),
                            (Recv(prv, buf, bb[got], bb[got + 1] - bb[got], COPY),)))
    return rounds


def _rsag_all_reduce(count: int, item: int, n: int, r: int, ring: bool) -> Schedule:
    bb = _bounds(_even(count, n), item)
    if ring:
        return Schedule("ring", tuple(_ring_rs(bb, n, r, BUF) + _ring_ag(bb, n, r, BUF)))
    return Schedule("rabenseifner", tuple(_halving_rs(bb, n, r, BUF) + _doubling_ag(bb, n, r, BUF)))


def _reduce_scatter(sizes: tuple, item: int, n: int, r: int, ring: bool) -> Schedule:
    """Inputs copied into TMP in rank order, reduce-scattered there (recursive halving,
    on a power of two only, or the ring); this rank's block is copied to BUF."""
    if not ring and n & (n - 1):
        raise ValueError(f"recursive_halving: expected a power-of-two group size, got {n}")
    bb = _bounds(sizes, item)
    rounds = _ring_rs(bb, n, r, TMP) if ring else _halving_rs(bb, n, r, TMP)
    return Schedule("ring" if ring else "recursive_halving", tuple(rounds), (Copy(INS, 0, TMP, 0, bb[n]),),
                    (Copy(TMP, bb[r], BUF, 0, bb[r + 1] - bb[r]),), bb[n])


# ------------------------------------------------------------------ all_gather
def _bruck_all_gather(sizes: tuple, item: int, n: int, r: int) -> Schedule:
    """Bruck: TMP holds the blocks rotated so that position j is rank (r + j) % n's.
    Round k sends positions [0, c) to r - 2^k and receives [2^k, 2^k + c) from r + 2^k,
    c = min(2^k, n - 2^k): ceil(log2 n) rounds, each block sent once per rank."""
    rot = [0]
    for j in range(n):
        rot.append(rot[-1] + sizes[(r + j) % n] * item)
    rounds = []
    k = 1
    while k < n:
        c = min(k, n - k)
        rounds.append(Round((Send((r - k) % n, TMP, 0, rot[c]),),
                            (Recv((r + k) % n, TMP, rot[k], rot[k + c] - rot[k], COPY),)))
        k <<= 1
    bb = _bounds(sizes, item)
    post = (Copy(TMP, 0, OUTS, bb[r], bb[n] - bb[r]), Copy(TMP, bb[n] - bb[r], OUTS, 0, bb[r]))
    return Schedule("bruck", tuple(rounds), (Copy(INP, 0, TMP, 0, sizes[r] * item),), post, bb[n])


# ------------------------------------------------------------------ rooted trees
def _binomial_bcast(nb: int, n: int, r: int, root: int) -> Schedule:
    """Round k: relative ranks [0, 2^k) send to [2^k, 2^(k+1)); the receiver answers
    with a ticket in the same round. ceil(log2 n) rounds."""
    v = (r - root) % n
    rounds = []
    for k in range(_log2(n)):
        m = 1 << k
        if v < m and v + m < n:
            c = (v + m + root) % n
            rounds.append(Round((Send(c, BUF, 0, nb),), (Recv(c, BUF, 0, 0),)))
        elif m <= v < 2 * m:
            p = (v - m + root) % n
            rounds.append(Round((Send(p, BUF, 0, 0),), (Recv(p, BUF, 0, nb, COPY),)))
        else:
            rounds.append(_IDLE)
    return Schedule("binomial", tuple(rounds))


def _binomial_reduce(nb: int, n: int, r: int, root: int) -> Schedule:
    """Round k: relative ranks with lowest set bit k send their partial result to
    v - 2^k, which reduces it after its own (relative rank order). The root
    accumulates in BUF, inner ranks in TMP (their BUF stays as it was)."""
    v = (r - root) % n
    inner = v != 0 and v % 2 == 0 and v + 1 < n
    acc = TMP if inner else BUF
    rounds = []
    for k in range(_log2(n)):
        m = 1 << k
        if v & m and not v & (m - 1):
            p = (v - m + root) % n
            rounds.append(Round((Send(p, acc, 0, nb),), (Recv(p, BUF, 0, 0),)))
        elif not v & (2 * m - 1) and v + m < n:
            c = (v + m + root) % n
            rounds.append(Round((Send(c, BUF, 0, 0),), (Recv(c, acc, 0, nb, REDUCE),)))
        else:
            rounds.append(_IDLE)
    pre = (Copy(BUF, 0, TMP, 0, nb),) if inner else ()
    return Schedule("binomial", tuple(rounds), pre, (), nb if inner else 0)


def _subtree(v: int, m: int, n: int) -> tuple:
    return v, min(v + m, n)


def subtree(n: int, rank: int, root: int) -> list:
    """The ranks whose blocks ``rank`` holds in a binomial gather (or is handed in a
    binomial scatter) rooted at ``root``, in relative rank order: itself first."""
    v = (rank - root) % n
    top = n if v == 0 else min(n, v + (v & -v))
    return [(j + root) % n for j in range(v, top)]


def _binomial_gather(sizes: tuple, item: int, n: int, r: int, root: int) -> Schedule:
    """TMP holds this rank's subtree's blocks in relative rank order; round k: ranks
    with lowest set bit k send theirs to v - 2^k. ``sizes`` must be right for this
    rank's subtree (the root knows all; see ``engine/_scheduled.py`` for the others)."""
    v = (r - root) % n
    rel = [0]  # rel[j]: offset of relative rank v + j's block in TMP
    top = n if v == 0 else min(n, v + (v & -v))
    for j in range(v, top):
        rel.append(rel[-1] + sizes[(j + root) % n] * item)
    leaf = top == v + 1
    rounds = []
    for k in range(_log2(n)):
        m = 1 << k
        if v & m and not v & (m - 1):
            p = (v - m + root) % n
            src = INP if leaf else TMP
            rounds.append(Round((Send(p, src, 0, rel[-1]),), (Recv(p, BUF, 0, 0),)))
        elif not v & (2 * m - 1) and v + m < n:
            c = (v + m + root) % n
            lo, hi = _subtree(v + m, m, n)
            rounds.append(Round((Send(c, BUF, 0, 0),), (Recv(c, TMP, rel[lo - v], rel[hi - v] - rel[lo - v]),)))
        else:
            rounds.append(_IDLE)
    pre = () if leaf else (Copy(INP, 0, TMP, 0, rel[1]),)
    post = ()
    if v == 0:
        bb = _bounds(sizes, item)
        src = INP if leaf else TMP  # (a one-rank group)
        post = (Copy(src, 0, OUTS, bb[root], bb[n] - bb[root]), Copy(src, bb[n] - bb[root], OUTS, 0, bb[root]))
    return Schedule("binomial", tuple(rounds), pre, post, 0 if leaf else rel[-1])


def _binomial_scatter(sizes: tuple, item: int, n: int, r: int, root: int) -> Schedule:
    """The gather's mirror: round t (mask 2^(K-1-t)) sends the upper half of a
    subtree's blocks to its child; a rank that holds only its own block
    receives it straight into BUF."""
    v = (r - root) % n
    rel = [0]
    top = n if v == 0 else min(n, v + (v & -v))
    for j in range(v, top):
        rel.append(rel[-1] + sizes[(j + root) % n] * item)
    leaf = top == v + 1
    rounds = []
    for k in reversed(range(_log2(n))):
        m = 1 << k
        if not v & (2 * m - 1) and v + m < n:
            c = (v + m + root) % n
            lo, hi = _subtree(v + m, m, n)
            rounds.append(Round((Send(c, TMP, rel[lo - v], rel[hi - v] - rel[lo - v]),), (Recv(c, BUF, 0, 0),)))
        elif v & (2 * m - 1) == m:
            p = (v - m + root) % n
            rounds.append(Round((Send(p, BUF, 0, 0),), (Recv(p, BUF if leaf else TMP, 0, rel[-1]),)))
        else:
            rounds.append(_IDLE)
    pre = ()
    if v == 0:
        bb = _bounds(sizes, item)
        dst = BUF if leaf else TMP  # (a one-rank group)
        pre = (Copy(INS, bb[root], dst, 0, bb[n] - bb[root]), Copy(INS, 0, dst, bb[n] - bb[root], bb[root]))
    post = () if leaf else (Copy(TMP, 0, BUF, 0, rel[1]),)
    return Schedule("binomial", tuple(rounds), pre, post, 0 if leaf else rel[-1])


# ------------------------------------------------------------------ the rest
def _dissemination_barrier(n: int, r: int) -> Schedule:
    rounds = []
    k = 1
    while k < n:
        rounds.append(Round((Send((r + k) % n, BUF, 0, 0),), (Recv((r - k) % n, BUF, 0, 0),)))
        k <<= 1
    return Schedule("dissemination", tuple(rounds))


def _pairwise_all_to_all(ins: tuple, outs: tuple, item: int, n: int, r: int) -> Schedule:
    """Round k (1..n-1): send to r + k, receive from r - k. n-1 rounds."""
    rounds = []
    for k in range(1, n):
        t, f = (r + k) % n, (r - k) % n
        rounds.append(Round((Send(t, IN + t, 0, ins[t] * item),), (Recv(f, OUT + f, 0, outs[f] * item),)))
    return Schedule("pairwise", tuple(rounds), (Copy(IN + r, 0, OUT + r, 0, ins[r] * item),))


def _bruck_all_to_all(ins: tuple, outs: tuple, item: int, n: int, r: int) -> Schedule:
    """Bruck, for an even all_to_all (every block ``b`` bytes, on every rank alike).

    TMP holds n slots, slot j first the block for rank (r + j) % n (``pre``: two
    copies, a rotation of the inputs), then a send and a receive staging area of
    c = max_k c_k blocks. Round k (k = 1, 2, 4, ... < n) sends the c_k slots j
    with bit k set to r + k and receives the same slots from r - k. Those slots
    are runs of k, not one region, so the round's ``pre`` packs them into the send
    area and its ``post`` unpacks the received area into them (one copy per run).
    Slot j ends holding rank (r - j) % n's block for r (``post``: one copy per
    block). ceil(log2 n) rounds; sum_k c_k <= (n // 2) ceil(log2 n) blocks sent."""
    if len(set(ins)) > 1 or tuple(ins) != tuple(outs):
        raise ValueError(f"bruck: expected the same count for every block, got inputs {ins} and outputs {outs}")
    b = ins[0] * item
    runs, k = [], 1
    while k < n:
        runs.append([(a, min(a + k, n)) for a in range(k, n, 2 * k)])
        k <<= 1
    c = max((sum(e - a for a, e in rk) for rk in runs), default=0)
    snd, rcv = n * b, (n + c) * b
    rounds = []
    for t, rk in enumerate(runs):
        k = 1 << t
        pack, unpack, pos = [], [], 0
        for a, e in rk:
            pack.append(Copy(TMP, a * b, TMP, snd + pos, (e - a) * b))
            unpack.append(Copy(TMP, rcv + pos, TMP, a * b, (e - a) * b))
            pos += (e - a) * b
        rounds.append(Round((Send((r + k) % n, TMP, snd, pos),), (Recv((r - k) % n, TMP, rcv, pos),),
                            tuple(pack), tuple(unpack)))
    pre = (Copy(INS, r * b, TMP, 0, (n - r) * b), Copy(INS, 0, TMP, (n - r) * b, r * b))
    post = tuple(Copy(TMP, j * b, OUT + (r - j) % n, 0, b) for j in range(n))
    return Schedule("bruck", tuple(rounds), pre, post, (n + 2 * c) * b)


#: the algorithms of each op, in the order ``choose`` prefers them
ALGOS = {
    "all_reduce": ("recursive_doubling", "rabenseifner", "ring"),
    "reduce_scatter": ("recursive_halving", "ring"),
    "all_gather": ("bruck",),
    "broadcast": ("binomial",),
    "reduce": ("binomial",),
    "gather": ("binomial",),
    "scatter": ("binomial",),
    "barrier": ("dissemination",),
    "all_to_all": ("bruck", "pairwise"),
}


@functools.lru_cache(maxsize=4096)
def schedule(op: str, algo: str, item: int, sizes: tuple, n: int, rank: int, root: int = 0) -> Schedule:
    """This rank's flat schedule of ``op`` by ``algo``.

    ``sizes`` (elements): ``(count,)`` for all_reduce / reduce / broadcast; one
    count per rank for reduce_scatter (its inputs), all_gather, gather and
    scatter; ``(ins, outs)`` (per-peer counts) for all_to_all; ``()`` for barrier.
    One flat level: ``_schedule.schedule`` is the entry that also builds the
    two-level ones (``_twolevel``), which are made of these.
    """
    if not 0 <= rank < n:
        raise ValueError(f"rank: expected 0 <= rank < {n}, got {rank}")
    if op == "all_reduce":
        count = sizes[0]
        if algo == "recursive_doubling":
            return _rd_all_reduce(count * item, n, rank)
        if algo == "rabenseifner":
            if n & (n - 1):
                raise ValueError(f"rabenseifner: expected a power-of-two group size, got {n}")
            return _rsag_all_reduce(count, item, n, rank, ring=False)
        if algo == "ring":
            return _rsag_all_reduce(count, item, n, rank, ring=True)
    elif op == "reduce_scatter" and algo in ALGOS[op]:
        return _reduce_scatter(sizes, item, n, rank, algo == "ring")
    elif op == "all_gather":
        return _bruck_all_gather(sizes, item, n, rank)
    elif op == "broadcast":
        return _binomial_bcast(sizes[0] * item, n, rank, root)
    elif op == "reduce":
        return _binomial_reduce(sizes[0] * item, n, rank, root)
    elif op == "gather":
        return _binomial_gather(sizes, item, n, rank, root)
    elif op == "scatter":
        return _binomial_scatter(sizes, item, n, rank, root)
    elif op == "barrier":
        return _dissemination_barrier(n, rank)
    elif op == "all_to_all" and algo == "bruck":
        return _bruck_all_to_all(sizes[0], sizes[1], item, n, rank)
    elif op == "all_to_all" and algo == "pairwise":
        return _pairwise_all_to_all(sizes[0], sizes[1], item, n, rank)
    raise ValueError(f"algo: expected one of {ALGOS.get(op)} for {op!r}, got {algo!r}")


#: the algorithm name of every two-level schedule (``_twolevel.py``) and its ops
TWO_LEVEL = "two_level"
TWO_LEVEL_OPS = ("all_reduce", "broadcast", "barrier", "all_gather")


def spans_hosts(topo) -> bool:
    """More than one host, and at least one host with more than one rank (with one
    rank per host, two levels are the flat algorithm): ``choose``'s test."""
    nh = max(topo) + 1 if topo else 0
    return 1 < nh < len(topo)


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
    ``direct`` or ``flat``: ``flat`` is ``auto`` as if every rank were on one host).
    (Here, beside the flat algorithms, so that ``_twolevel`` can choose its leaders'
    algorithm without importing ``_schedule``; one call on every op's path.)"""
    if force == "direct" or n <= 1:
        return None
    if force != "flat" and topo is not None and op in TWO_LEVEL_OPS and spans_hosts(topo):
        return TWO_LEVEL
    if force != "sched" and n <= DIRECT_MAX_RANKS:
        return None
    if op == "all_reduce":
        if nbytes <= SMALL_MAX or count < n:
            return "recursive_doubling"
        return "ring" if n & (n - 1) else "rabenseifner"
    if op == "reduce_scatter":
        return "ring" if n & (n - 1) else "recursive_halving"
    if op == "all_to_all":
        return "bruck" if even and nbytes <= A2A_BRUCK_MAX else "pairwise"
    return ALGOS[op][0]
