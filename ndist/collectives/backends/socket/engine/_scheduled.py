"""Run ``schedules/`` schedules on the socket backend's Python engine.

``Scheduled.run`` plays one rank's ``Schedule``: the ``pre`` copies, then one
engine step per round that has messages (frames carry step ``step0 + t`` mod
250, distinct per round of the op) between the round's own ``pre`` and ``post``
copies, then the schedule's ``post`` copies. A send goes
inline, or, to a same-host peer when ``links.shm`` says so, as a reference into
this rank's shared-memory segment: every round's staged payloads get their own
place in the segment (reserved once per op), because a peer may still read a
round's payload after this rank went on to the next one. COPY receives land in
place (``Expect.into``); the reductions of a round run after all its messages
arrived, in the schedule's order, with ``_reduce.reduce_ordered``.

Two-level schedules (``schedules/_twolevel.py``, a group on several hosts) get the
group's topology from ``links.hosts``; they run like every other schedule.

The op methods map their arguments onto the schedule's buffers (``BUF``,
``INP``, ``TMP``, the output / input lists) and finalize reductions (AVG,
PREMUL_SUM) once, after the last round. Gather and scatter run two schedules:
first the byte counts along the tree (8 bytes per rank, always inline: the
segment is reserved once per op), so that every inner rank knows the sizes of
the blocks it forwards, then the data.
"""

from __future__ import annotations

import numpy as np

from ..wire import _frame as F
from ..schedules import _schedule as S
from ._engine import Expect
from ..schedules._reduce import finalize, reduce_ordered

__all__ = ["Scheduled"]

_ALIGN = 64
_STEPS = 250  # frame step numbers used by schedules (251..255 are taken)


def _u8(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


class _Bufs:
    """A schedule's buffer ids resolved to this call's arrays (all uint8, 1-D)."""

    __slots__ = ("fixed", "outs", "ins")

    def __init__(self, fixed: dict, outs=(), ins=()) -> None:
        self.fixed = fixed
        self.outs = outs
        self.ins = ins

    def get(self, ref: int) -> np.ndarray:
        if ref < S.OUT:
            return self.fixed[ref]
        if ref < S.IN:
            return self.outs[ref - S.OUT]
        return self.ins[ref - S.IN]

    def copy(self, c) -> None:
        if not c.nbytes:
            return
        if c.src == S.INS:
            self._split(self.ins, c.src_off, self.get(c.dst)[c.dst_off:c.dst_off + c.nbytes], out=False)
        elif c.dst == S.OUTS:
            self._split(self.outs, c.dst_off, self.get(c.src)[c.src_off:c.src_off + c.nbytes], out=True)
        else:
            np.copyto(self.get(c.dst)[c.dst_off:c.dst_off + c.nbytes], self.get(c.src)[c.src_off:c.src_off + c.nbytes])

    @staticmethod
    def _split(parts, off: int, flat: np.ndarray, out: bool) -> None:
        """Copy between ``flat`` and bytes [off, off + len) of the concatenation of ``parts``."""
        pos, done = 0, 0
        for p in parts:
            end = pos + p.nbytes
            if end > off and done < flat.nbytes:
                a = max(off + done, pos) - pos
                k = min(p.nbytes - a, flat.nbytes - done)
                if out:
                    np.copyto(p[a:a + k], flat[done:done + k])
                else:
                    np.copyto(flat[done:done + k], p[a:a + k])
                done += k
            pos = end


class Scheduled:
    """The scheduled collectives of one backend, over its engine and links."""

    def __init__(self, eng, links, rank: int, size: int) -> None:
        self.eng = eng
        self.links = links
        self.rank = rank
        self.size = size
        self._tmp = np.empty(0, np.uint8)

    # ------------------------------------------------------------ executor
    def run(self, sch, bufs: _Bufs, dt=None, op=None, step0: int = 0, shm: bool = True) -> None:
        """Play ``sch`` over ``bufs``; ``shm=False``: every payload inline (the segment is
        reserved once per op and must not grow or be reused while peers read it)."""
        eng, links = self.eng, self.links
        if sch.tmp > self._tmp.nbytes:
            self._tmp = np.empty(max(sch.tmp, 2 * self._tmp.nbytes), np.uint8)
        bufs.fixed[S.TMP] = self._tmp[:sch.tmp]
        for c in sch.pre:
            bufs.copy(c)
        seg, cur = self._segment(sch) if shm else None, 0
        get = bufs.get
        for t, (sends, recvs, pre, post) in enumerate(sch.rounds):
            for c in pre:
                bufs.copy(c)
            if not sends and not recvs:
                for c in post:
                    bufs.copy(c)
                continue
            step = (step0 + t) % _STEPS
            # this round's links first: a dead peer fails the op before any frame goes out
            eng.open_links([x.peer for x in (*sends, *recvs)])
            for s in sends:
                nb = s.nbytes
                if not nb:
                    eng.send(s.peer, step)
                    continue
                data = get(s.buf)[s.off:s.off + nb]
                if seg is not None and links.shm(s.peer, nb):
                    np.copyto(seg[cur:cur + nb], data)
                    eng.send(s.peer, step, shm_offset=cur, nbytes=nb)
                    cur += (nb + _ALIGN - 1) // _ALIGN * _ALIGN
                else:
                    eng.send(s.peer, step, data)
            exps = [Expect(v.peer, F.DATA, step, v.nbytes,
                           into=get(v.buf)[v.off:v.off + v.nbytes] if v.mode == S.COPY and v.nbytes else None)
                    for v in recvs]
            eng.step(exps)
            for v, e in zip(recvs, exps):
                if v.mode != S.COPY and v.nbytes:
                    dst = get(v.buf)[v.off:v.off + v.nbytes].view(dt)
                    msg = e.result.view(dt)
                    reduce_ordered(dst, [dst, msg] if v.mode == S.REDUCE else [msg, dst], op)
            for c in post:
                bufs.copy(c)
        for c in sch.post:
            bufs.copy(c)

    def _segment(self, sch):
        """Our segment, large enough for every payload of ``sch`` that goes by reference."""
        links = self.links
        total = 0
        for rnd in sch.rounds:
            for s in rnd.sends:
                if s.nbytes >= links.shm_min and links.shm(s.peer, s.nbytes):
                    total += (s.nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
        return self.eng.segment(total) if total else None

    def _sched(self, op, algo, item, sizes, root=0):
        topo = self.links.hosts if algo == S.TWO_LEVEL else None
        return S.schedule(op, algo, item, sizes, self.size, self.rank, root, topo)

    # ------------------------------------------------------------ ops
    def all_reduce(self, buf, op, scale, algo: str) -> None:
        flat = buf.reshape(-1)
        self.run(self._sched("all_reduce", algo, buf.itemsize, (flat.size,)), _Bufs({S.BUF: _u8(flat)}),
                 buf.dtype, op)
        finalize(flat, op, scale, self.size)

    def reduce(self, buf, op, scale, root: int, algo: str) -> None:
        flat = buf.reshape(-1)
        self.run(self._sched("reduce", algo, buf.itemsize, (flat.size,), root), _Bufs({S.BUF: _u8(flat)}),
                 buf.dtype, op)
        if self.rank == root:
            finalize(flat, op, scale, self.size)

    def reduce_scatter(self, out, inputs, op, scale, algo: str) -> None:
        sizes = tuple(int(a.size) for a in inputs)
        self.run(self._sched("reduce_scatter", algo, out.itemsize, sizes),
                 _Bufs({S.BUF: _u8(out)}, ins=[_u8(a) for a in inputs]), out.dtype, op)
        finalize(out, op, scale, self.size)

    def broadcast(self, buf, root: int, algo: str) -> None:
        self.run(self._sched("broadcast", algo, 1, (buf.nbytes,), root), _Bufs({S.BUF: _u8(buf)}))

    def all_gather(self, outputs, inp, algo: str) -> None:
        sizes = tuple(int(o.nbytes) for o in outputs)
        self.run(self._sched("all_gather", algo, 1, sizes),
                 _Bufs({S.INP: _u8(inp)}, outs=[_u8(o) for o in outputs]))

    def gather(self, outputs, inp, root: int, algo: str) -> None:
        n, r = self.size, self.rank
        counts = np.zeros(n, np.uint64)
        own = np.array([inp.nbytes], np.uint64)
        phase1 = self._sched("gather", algo, 8, (1,) * n, root)
        self.run(phase1, _Bufs({S.INP: _u8(own), S.BUF: _u8(counts[:0])},
                               outs=[_u8(counts[i:i + 1]) for i in range(n)]), shm=False)
        if r == root:
            sizes = tuple(int(o.nbytes) for o in outputs)
        else:
            sizes = self._known(phase1, own, root)
        self.run(self._sched("gather", algo, 1, sizes, root),
                 _Bufs({S.INP: _u8(inp), S.BUF: _u8(counts[:0])},
                       outs=[_u8(o) for o in outputs] if r == root else ()), step0=len(phase1.rounds))

    def scatter(self, out, inputs, root: int, algo: str) -> None:
        n, r = self.size, self.rank
        own = np.zeros(1, np.uint64)
        phase1 = self._sched("scatter", algo, 8, (1,) * n, root)
        if r == root:
            counts = np.array([a.nbytes for a in inputs], np.uint64)
            self.run(phase1, _Bufs({S.BUF: _u8(own)}, ins=[_u8(counts[i:i + 1]) for i in range(n)]), shm=False)
            sizes = tuple(int(a.nbytes) for a in inputs)
        else:
            self.run(phase1, _Bufs({S.BUF: _u8(own)}), shm=False)
            sizes = self._known(phase1, own, root)
        self.run(self._sched("scatter", algo, 1, sizes, root),
                 _Bufs({S.BUF: _u8(out)}, ins=[_u8(a) for a in inputs] if r == root else ()),
                 step0=len(phase1.rounds))

    def _known(self, phase1, own: np.ndarray, root: int) -> tuple:
        """The byte sizes this rank learnt in a counts phase: its subtree's, 0 elsewhere."""
        got = self._tmp[:phase1.tmp].view(np.uint64) if phase1.tmp else own
        sizes = [0] * self.size
        for q, c in zip(S.subtree(self.size, self.rank, root), got):
            sizes[q] = int(c)
        return tuple(sizes)

    def barrier(self, algo: str) -> None:
        self.run(self._sched("barrier", algo, 1, ()), _Bufs({S.BUF: np.zeros(0, np.uint8)}))

    def all_to_all(self, outputs, inputs, algo: str) -> None:
        sizes = (tuple(int(a.nbytes) for a in inputs), tuple(int(a.nbytes) for a in outputs))
        self.run(self._sched("all_to_all", algo, 1, sizes),
                 _Bufs({}, outs=[_u8(o) for o in outputs], ins=[_u8(a) for a in inputs]))
