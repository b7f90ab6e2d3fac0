"""Run the ranks' schedules in one process over simulated links (no sockets).

``simulate(schedules, buffers, dtype, op)`` plays every rank's ``Schedule`` round
by round: the sends of round t are captured first (as the engine reads them when
the round starts), then each rank's receives take the oldest message on the
(sender, receiver) link, which must be of the same round and length, COPY
receives land and the reductions run after them, in list order, with the real
kernels (``_reduce.reduce_ordered``); a round's own ``pre`` copies run before
its sends are captured, its ``post`` copies after its reductions. It checks the rules of ``_schedule`` on
the way and counts, per rank, the rounds it was active in, the messages and the
bytes it sent and received. It also tracks which ranks' arrival each rank has
heard of (directly or through others), so a barrier can be checked.

With ``hosts`` (the host of every rank) it also counts what crosses hosts: per
rank the messages and bytes sent to / received from another host and the
rounds in which it sent any, and in all the global rounds that carried any.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from . import _schedule as S
from ._reduce import reduce_ordered

__all__ = ["simulate", "Stats", "ScheduleError"]


class ScheduleError(AssertionError):
    """The schedules broke a rule, or do not match between ranks."""


class Stats:
    """Per-rank counts of one simulated op (NumPy arrays indexed by rank)."""

    def __init__(self, n: int) -> None:
        self.rounds = np.zeros(n, np.int64)
        self.msgs_sent = np.zeros(n, np.int64)
        self.bytes_sent = np.zeros(n, np.int64)
        self.msgs_recv = np.zeros(n, np.int64)
        self.bytes_recv = np.zeros(n, np.int64)
        self.depth = 0  # global rounds
        self.heard = [0] * n  # bit q set: rank q's arrival is known to this rank
        # with hosts: what crossed hosts
        self.xmsgs_sent = np.zeros(n, np.int64)
        self.xbytes_sent = np.zeros(n, np.int64)
        self.xmsgs_recv = np.zeros(n, np.int64)
        self.xbytes_recv = np.zeros(n, np.int64)
        self.xrounds_rank = np.zeros(n, np.int64)  # rounds in which the rank sent across hosts
        self.xrounds = 0  # global rounds in which any message crossed hosts


def _region(bufs: dict, ref: int, off: int, nbytes: int) -> np.ndarray:
    b = bufs.get(ref)
    if b is None:
        raise ScheduleError(f"buffer {ref} is not defined for this op")
    if off < 0 or nbytes < 0 or off + nbytes > b.nbytes:
        raise ScheduleError(f"region [{off}, {off + nbytes}) outside buffer {ref} of {b.nbytes} bytes")
    return b[off:off + nbytes]


def _copies(bufs: dict, copies, where: str = "") -> None:
    for c in copies:
        if c.src == c.dst and c.nbytes and c.src_off < c.dst_off + c.nbytes and c.dst_off < c.src_off + c.nbytes:
            raise ScheduleError(f"{where}copy {c} overlaps its own source")
        src = _region(bufs, c.src, c.src_off, c.nbytes)
        np.copyto(_region(bufs, c.dst, c.dst_off, c.nbytes), src)


def _overlap(a, b) -> bool:
    return a.buf == b.buf and a.nbytes and b.nbytes and a.off < b.off + b.nbytes and b.off < a.off + a.nbytes


def simulate(schedules: list, buffers: list, dtype=np.uint8, op=None, hosts=None) -> Stats:
    """Run ``schedules[r]`` over ``buffers[r]`` (``{buffer id: uint8 array}``; TMP is
    made here) for every rank r; return the per-rank ``Stats``. ``hosts[r]``: rank
    r's host (anything comparable), to count the traffic between hosts."""
    n = len(schedules)
    st = Stats(n)
    if hosts is not None and len(hosts) != n:
        raise ValueError(f"hosts: expected one host per rank ({n}), got {len(hosts)}")
    dt = np.dtype(dtype)
    rounds, msent, bsent, mrecv, brecv = ([0] * n for _ in range(5))
    heard = [1 << r for r in range(n)]
    for r, sch in enumerate(schedules):
        buffers[r][S.TMP] = np.zeros(sch.tmp, np.uint8)
        _copies(buffers[r], sch.pre, f"rank {r} pre: ")
    links: dict = {}
    depth = max((len(s.rounds) for s in schedules), default=0)
    for t in range(depth):
        crossed = False
        for r, sch in enumerate(schedules):
            if t >= len(sch.rounds):
                continue
            sends, recvs, pre, _ = sch.rounds[t]
            bufs = buffers[r]
            _copies(bufs, pre, f"rank {r} round {t}: ")  # before the sends are read
            if not sends and not recvs:
                continue
            rounds[r] += 1
            xr = False
            if len(sends) > 1 and len({s.peer for s in sends}) != len(sends) or \
                    len(recvs) > 1 and len({v.peer for v in recvs}) != len(recvs):
                raise ScheduleError(f"rank {r} round {t}: more than one message per peer and direction")
            for s in sends:
                peer, nb = s.peer, s.nbytes
                if not 0 <= peer < n or peer == r:
                    raise ScheduleError(f"rank {r} round {t}: send to {peer}")
                data = _region(bufs, s.buf, s.off, nb).copy()
                q = links.get((r, peer))
                if q is None:
                    q = links[(r, peer)] = deque()
                q.append((t, data, heard[r]))
                msent[r] += 1
                bsent[r] += nb
                if hosts is not None and hosts[peer] != hosts[r]:
                    if not xr:
                        st.xrounds_rank[r] += 1
                        xr = True
                    st.xmsgs_sent[r] += 1
                    st.xbytes_sent[r] += nb
                    st.xmsgs_recv[peer] += 1
                    st.xbytes_recv[peer] += nb
                    crossed = True
                for v in recvs:
                    if v.mode == S.COPY and _overlap(v, s):
                        raise ScheduleError(f"rank {r} round {t}: COPY receive {v} overlaps a send")
        st.xrounds += crossed
        for r, sch in enumerate(schedules):
            if t >= len(sch.rounds):
                continue
            _, recvs, _, post = sch.rounds[t]
            bufs = buffers[r]
            reductions = []
            for v in recvs:
                q = links.get((v.peer, r))
                if not q:
                    raise ScheduleError(f"rank {r} round {t}: expects {v.nbytes} bytes from {v.peer}, none sent")
                t0, data, h = q.popleft()
                if t0 != t or data.nbytes != v.nbytes:
                    raise ScheduleError(f"rank {r} round {t}: expects {v.nbytes} bytes from {v.peer}, which sent "
                                        f"{data.nbytes} bytes in round {t0}")
                heard[r] |= h
                mrecv[r] += 1
                brecv[r] += v.nbytes
                if v.nbytes:
                    dst = _region(bufs, v.buf, v.off, v.nbytes)
                    if v.mode == S.COPY:
                        dst[...] = data
                    else:
                        if v.nbytes % dt.itemsize:
                            raise ScheduleError(f"rank {r} round {t}: reduces {v.nbytes} bytes of {dt}")
                        reductions.append((v.mode, dst, data))
            for mode, dst, data in reductions:
                d, m = dst.view(dt), data.view(dt)
                reduce_ordered(d, [d, m] if mode == S.REDUCE else [m, d], op)
            _copies(bufs, post, f"rank {r} round {t}: ")  # after the receives and reductions
    left = [k for k, q in links.items() if q]
    if left:
        raise ScheduleError(f"messages never received on links (sender, receiver): {left[:5]}")
    for r, sch in enumerate(schedules):
        _copies(buffers[r], sch.post, f"rank {r} post: ")
    st.rounds[:], st.msgs_sent[:], st.bytes_sent[:], st.msgs_recv[:], st.bytes_recv[:] = \
        rounds, msent, bsent, mrecv, brecv
    st.depth = depth
    st.heard = heard
    return st
