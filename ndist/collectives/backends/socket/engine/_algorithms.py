"""Collective algorithms of the socket backend, written against the engine.

Each is one or two steps of direct exchanges: every peer gets its part in the
same step, so with non-blocking streams nothing waits on a pairwise order and
``n`` ranks progress at once. Payloads to a peer on the same host go through
this rank's shared-memory segment (written once, read — or reduced from —
in place by every peer); to other peers inline over TCP. Choices depend only
on (op, byte size, group size, transport), so all ranks choose alike.

* all_reduce: direct (everyone sends everything, everyone reduces in rank
  order) up to ``DIRECT_MAX`` bytes; above, reduce-scatter + all-gather, each
  rank reducing its slice straight from the peers' buffers.
* reduce / gather: direct to the root; broadcast / scatter: direct from it;
  a header-only ticket flows the other way so both sides check the call.
* all_to_all, reduce_scatter, all_gather: one pairwise exchange step.

Floating-point results are identical on every rank (same order of reduction).

Groups of more than ``_schedule.DIRECT_MAX_RANKS`` ranks run the log-depth
schedules of ``schedules/_schedule.py`` instead (``engine/_scheduled.py`` executes them), and a
group on several hosts the two-level ones of ``_twolevel.py`` for all_reduce,
broadcast, barrier and all_gather; ``choose`` decides per (op, bytes, group
size, hosts), alike on every rank. ``NDIST_ALGO=direct|sched|flat|auto`` (every
rank alike) forces one family (``flat``: the single-level choice across hosts).
"""

from __future__ import annotations

import os

import numpy as np

from ..wire import _frame as F
from ._engine import Expect
from ..schedules._reduce import finalize, reduce_ordered
from ..schedules._flat import choose, spans_hosts
from ._scheduled import Scheduled

__all__ = ["Algorithms", "DIRECT_MAX", "ALGO_ENV", "algo_mode"]

#: ``direct``: one-step exchanges at every group size; ``sched``: the schedules at
#: every size > 1; ``flat``: as ``auto`` but never two levels; ``auto`` (default):
#: direct up to ``DIRECT_MAX_RANKS`` ranks on one host, two levels across hosts.
ALGO_ENV = "NDIST_ALGO"

DIRECT_MAX = 256 << 10
#: bytes of the buffer per pipelined reduce-scatter + all-gather round
CHUNK = 4 << 20
#: bytes per piece of one all_to_all message
A2A_CHUNK = 2 << 20
TICKET = 2
#: all_to_all messages at least this large to a peer that can read our memory go
#: by cross-memory attach: one copy instead of two through the segment, plus one
#: header-only "done" frame back (step ``CMA_DONE``) before the sender returns.
CMA_MIN = 512 << 10
CMA_DONE = 251
_ALIGN = 64


def _bytes(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


def algo_mode() -> str:
    mode = os.environ.get(ALGO_ENV, "auto").strip().lower() or "auto"
    if mode not in ("auto", "direct", "sched", "flat"):
        raise ValueError(f"{ALGO_ENV}: expected 'auto', 'direct', 'sched' or 'flat', got {mode!r}")
    return mode


class Algorithms:
    """The collectives of one backend, over its engine (``eng``), its shared-memory
    segment (``seg``) and its per-peer transport choice (``links``)."""

    def __init__(self, eng, seg, links, rank: int, size: int) -> None:
        self.eng = eng
        self.seg = seg
        self.links = links
        self.rank = rank
        self.size = size
        self.peers = tuple(p for p in range(size) if p != rank)
        self.mode = algo_mode()
        # the topology only where two levels may apply (one host: choose never looks)
        self.topo = links.hosts if links.hosts is not None and spans_hosts(links.hosts) else None
        self.sched = Scheduled(eng, links, rank, size)

    def _algo(self, op: str, nbytes: int = 0, count: int = 0, even: bool = False):
        """The schedule's algorithm for this call, or None for the direct exchange."""
        return choose(op, nbytes, self.size, count, self.mode, self.topo, even)

    # ---------------------------------------------------------- staging
    def _stage(self, arrays: list) -> list:
        """Copy ``arrays`` (uint8) into our segment; return their offsets."""
        offs, total = [], 0
        for a in arrays:
            offs.append(total)
            total += (a.nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
        seg = self.eng.segment(total)
        for a, o in zip(arrays, offs):
            if a.nbytes:
                np.copyto(seg[o : o + a.nbytes], a)
        return offs

    def _reserve_layout(self, arrays: list) -> list:
        """Offsets for ``arrays`` in our segment, reserved but not written."""
        offs, total = [], 0
        for a in arrays:
            offs.append(total)
            total += (a.nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
        self.eng.segment(total)
        return offs

    def _send_same(self, peers, data: np.ndarray, step: int = 0) -> None:
        """Send the same bytes to every peer in ``peers`` (staged once if any uses shm)."""
        eng = self.eng
        eng.open_links(peers)  # a dead peer fails the op before a frame goes to any peer
        off = None
        if data.nbytes >= self.links.shm_min and any(self.links.shm(p, data.nbytes) for p in peers):
            off = self._stage([data])[0]
        for p in peers:
            if off is not None and self.links.shm(p, data.nbytes):
                eng.send(p, step, shm_offset=off, nbytes=data.nbytes)
            else:
                eng.send(p, step, data)

    def _send_each(self, parts: dict, step: int = 0) -> None:
        """Send ``parts[p]`` (uint8) to each peer ``p``."""
        eng = self.eng
        eng.open_links(parts)
        shm = [p for p, a in parts.items() if self.links.shm(p, a.nbytes)]
        offs = dict(zip(shm, self._stage([parts[p] for p in shm]))) if shm else {}
        for p, a in parts.items():
            if p in offs:
                eng.send(p, step, shm_offset=offs[p], nbytes=a.nbytes)
            else:
                eng.send(p, step, a)

    def _tickets(self, peers) -> None:
        """Rooted ops: the ranks that only receive (or only send) send a header-only
        ticket the other way, so that a mismatched call (other op, dtype, count or
        root) is seen by both sides instead of completing silently or hanging."""
        self.eng.open_links(peers)
        for p in peers:
            self.eng.send(p, TICKET)

    # ---------------------------------------------------------- reductions
    def all_reduce(self, buf, op, scale):
        algo = self._algo("all_reduce", buf.nbytes, buf.size)
        if algo is not None:
            return self.sched.all_reduce(buf, op, scale, algo)
        if buf.nbytes <= DIRECT_MAX or buf.size < self.size:
            return self.direct_reduce(buf, op, scale, root=None)
        return self.rs_ag(buf, op, scale)

    def direct_reduce(self, buf, op, scale, root):
        if root is not None:
            algo = self._algo("reduce", buf.nbytes)
            if algo is not None:
                return self.sched.reduce(buf, op, scale, root, algo)
        eng, r, dt = self.eng, self.rank, buf.dtype
        data = _bytes(buf)
        if root is not None and r != root:
            self._send_same([root], data)
            eng.step([Expect(root, F.DATA, TICKET, 0)])
            return
        peers = self.peers
        if root is None:
            self._send_same(peers, data)
        else:
            self._tickets(peers)
        nb = data.nbytes
        exps = [Expect(p, F.DATA, 0, nb) for p in peers]
        eng.step(exps)
        # reduce in rank order, in flat views (buf is contiguous)
        flat = buf.reshape(-1)
        res = iter(exps)
        own = flat if r < 2 else flat.copy()
        contribs = [own if p == r else next(res).result.view(dt) for p in range(self.size)]
        reduce_ordered(flat, contribs, op)
        finalize(flat, op, scale, self.size)

    def rs_ag(self, buf, op, scale):
        """Reduce-scatter + all-gather, pipelined in chunks of ``CHUNK`` bytes so that
        what one rank writes is still in the shared cache when a peer reads it.

        A peer that can read our memory reads its slices straight from ``buf``
        (no copy into the segment; our own slice is reduced in place when the
        rank order allows it); it says "done" once at the end, before we return."""
        eng, n, dt = self.eng, self.size, buf.dtype
        flat = buf.reshape(-1)
        item = dt.itemsize
        per = max(n, self.links.chunk // item)
        k = -(-flat.size // per)
        peers = self.peers
        small = per * item // n
        eng.open_links(peers)  # both ends of each pair agree on its paths (CMA) first
        cma_out = {p for p in peers if p in self.links.cma_to and self.links.shm(p, small)}
        cma_in = [p for p in peers if p in self.links.cma_from and self.links.shm(p, small)]
        shm_all = any(p not in cma_out and self.links.shm(p, small) for p in peers)
        seg = eng.segment(flat.size * item) if shm_all else None
        for c in range(k):
            lo = c * flat.size // k
            hi = (c + 1) * flat.size // k
            self._rs_ag_chunk(flat, lo, hi, op, scale, seg, 2 * (c % 100), cma_out)
        if cma_in or cma_out:
            for p in cma_in:
                eng.send(p, CMA_DONE)
            eng.step([Expect(p, F.DATA, CMA_DONE, 0) for p in sorted(cma_out)])

    def _rs_ag_chunk(self, flat, a, b, op, scale, seg, step, cma_out):
        eng, r, n, dt = self.eng, self.rank, self.size, flat.dtype
        item = dt.itemsize
        bounds = [a + (b - a) * i // n for i in range(n + 1)]
        lo, hi = bounds[r], bounds[r + 1]
        data = flat.view(np.uint8)
        chunk = lambda i: data[bounds[i] * item : bounds[i + 1] * item]  # noqa: E731
        peers = self.peers
        shm = [p for p in peers if seg is not None and p not in cma_out and self.links.shm(p, chunk(p).nbytes)]
        for p in shm:
            # the segment mirrors buf: peers read their slice; ours will hold the result
            np.copyto(seg[bounds[p] * item : bounds[p + 1] * item], chunk(p))
        for p in peers:
            if p in cma_out:
                eng.send_cma(p, step, chunk(p))
            elif p in shm:
                eng.send(p, step, shm_offset=bounds[p] * item, nbytes=chunk(p).nbytes)
            else:
                eng.send(p, step, chunk(p))
        exps = [Expect(p, F.DATA, step, (hi - lo) * item) for p in peers]
        eng.step(exps)
        mine = flat[lo:hi]
        if shm:
            out = seg[lo * item : hi * item].view(dt)
        elif r < 2:  # reduce_ordered allows out to be contribs[0] or [1]
            out = mine
        else:
            out = eng.scratch(r, (hi - lo) * item).view(dt)
        res = iter(exps)
        contribs = [mine if p == r else next(res).result.view(dt) for p in range(n)]
        reduce_ordered(out, contribs, op)
        finalize(out, op, scale, n)
        for p in peers:
            if p in cma_out:
                eng.send_cma(p, step + 1, chunk(r))  # read after the copy below: frames go out in step()
            elif p in shm:
                eng.send(p, step + 1, shm_offset=lo * item, nbytes=(hi - lo) * item)
            else:
                eng.send(p, step + 1, out.view(np.uint8))
        exps = [Expect(p, F.DATA, step + 1, chunk(p).nbytes, into=chunk(p)) for p in peers]
        if out is not mine:
            mine[...] = out
        eng.step(exps)

    def reduce_scatter(self, out, inputs, op, scale):
        algo = self._algo("reduce_scatter", out.nbytes)
        if algo is not None:
            return self.sched.reduce_scatter(out, inputs, op, scale, algo)
        eng, r, dt = self.eng, self.rank, out.dtype
        peers = self.peers
        self._send_each({p: _bytes(inputs[p]) for p in peers})
        exps = [Expect(p, F.DATA, 0, out.nbytes) for p in peers]
        eng.step(exps)
        own = inputs[r]
        if np.may_share_memory(own, out):
            own = own.copy()
        res = iter(exps)
        contribs = [own.reshape(out.shape) if p == r else next(res).result.view(dt).reshape(out.shape)
                    for p in range(self.size)]
        reduce_ordered(out, contribs, op)
        finalize(out, op, scale, self.size)

    # ---------------------------------------------------------- movement
    def broadcast(self, buf, src):
        algo = self._algo("broadcast", buf.nbytes)
        if algo is not None:
            return self.sched.broadcast(buf, src, algo)
        data = _bytes(buf)
        if self.rank == src:
            self._send_same(self.peers, data)
            self.eng.step([Expect(p, F.DATA, TICKET, 0) for p in self.peers])
        else:
            self._tickets([src])
            self.eng.step([Expect(src, F.DATA, 0, data.nbytes, into=data)])

    def all_gather(self, outputs, inp):
        algo = self._algo("all_gather", inp.nbytes)
        if algo is not None:
            return self.sched.all_gather(outputs, inp, algo)
        data = _bytes(inp)
        peers = self.peers
        self._send_same(peers, data)
        self.eng.step([Expect(p, F.DATA, 0, outputs[p].nbytes, into=_bytes(outputs[p])) for p in peers])
        np.copyto(_bytes(outputs[self.rank]), data)

    def gather(self, outputs, inp, dst):
        algo = self._algo("gather", inp.nbytes)
        if algo is not None:
            return self.sched.gather(outputs, inp, dst, algo)
        data = _bytes(inp)
        if self.rank != dst:
            self._send_same([dst], data)
            self.eng.step([Expect(dst, F.DATA, TICKET, 0)])
            return
        self._tickets(self.peers)
        self.eng.step([Expect(p, F.DATA, 0, outputs[p].nbytes, into=_bytes(outputs[p]))
                              for p in self.peers])
        np.copyto(_bytes(outputs[dst]), data)

    def scatter(self, out, inputs, src):
        algo = self._algo("scatter", out.nbytes)
        if algo is not None:
            return self.sched.scatter(out, inputs, src, algo)
        data = _bytes(out)
        if self.rank != src:
            self._tickets([src])
            self.eng.step([Expect(src, F.DATA, 0, data.nbytes, into=data)])
            return
        self._send_each({p: _bytes(inputs[p]) for p in self.peers})
        self.eng.step([Expect(p, F.DATA, TICKET, 0) for p in self.peers])
        np.copyto(data, _bytes(inputs[src]))

    def all_to_all(self, outputs, inputs, even: bool = False):
        """Pairwise exchange, every pair at once. A large message to a peer that can
        read our memory is read by it straight from ``inputs`` (one copy; we wait
        for its "done" before returning). Other messages above ``A2A_CHUNK`` go in
        pieces (count from the message size, so both sides agree) so that a peer
        copies each piece out of our segment while it is still in the shared cache.
        ``even``: the call promises every rank's blocks are all one size (an
        ``all_to_all_single`` without split sizes), so the schedules may use Bruck."""
        algo = self._algo("all_to_all", inputs[0].nbytes if even else 0, even=even)
        if algo is not None:
            return self.sched.all_to_all(outputs, inputs, algo)
        eng = self.eng
        peers = self.peers
        eng.open_links(peers)  # every pair talks; both ends agree on each pair's paths (CMA) first
        ins = {p: _bytes(inputs[p]) for p in peers}
        outs = {p: _bytes(outputs[p]) for p in peers}
        small = self.links.shm_min  # below it every message is inline, one piece, no CMA (either side)
        if all(ins[p].nbytes < small and outs[p].nbytes < small for p in peers):
            for p in peers:
                eng.send(p, 0, ins[p])
            eng.step([Expect(p, F.DATA, 0, outs[p].nbytes, into=outs[p]) for p in peers])
            np.copyto(_bytes(outputs[self.rank]), _bytes(inputs[self.rank]))
            return
        cma_out = [p for p in peers if p in self.links.cma_to and ins[p].nbytes >= CMA_MIN]
        cma_in = [p for p in peers if p in self.links.cma_from and outs[p].nbytes >= CMA_MIN]
        pieces = lambda p, nb: max(1, -(-nb // A2A_CHUNK)) if self.links.pipeline else 1  # noqa: E731
        shm = [p for p in peers if p not in cma_out and self.links.shm(p, ins[p].nbytes)]
        offs = dict(zip(shm, self._reserve_layout([ins[p] for p in shm]))) \
            if shm else {}
        seg = self.seg.buf
        k_in = {p: 1 if p in cma_out else pieces(p, ins[p].nbytes) for p in peers}
        k_out = {p: 1 if p in cma_in else pieces(p, outs[p].nbytes) for p in peers}
        for s in range(max([*k_in.values(), *k_out.values(), 1])):
            step = s % 250
            for p in peers:
                k = k_in[p]
                if s < k:
                    nb = ins[p].nbytes
                    a, b = nb * s // k, nb * (s + 1) // k
                    if p in cma_out:
                        eng.send_cma(p, step, ins[p])
                    elif p in offs:
                        o = offs[p]
                        np.copyto(seg[o + a : o + b], ins[p][a:b])
                        eng.send(p, step, shm_offset=o + a, nbytes=b - a)
                    else:
                        eng.send(p, step, ins[p][a:b])
            exps = []
            for p in peers:
                k = k_out[p]
                if s < k:
                    nb = outs[p].nbytes
                    exps.append(Expect(p, F.DATA, step, nb * (s + 1) // k - nb * s // k,
                                       into=outs[p][nb * s // k : nb * (s + 1) // k]))
            eng.step(exps)
        for p in cma_in:
            eng.send(p, CMA_DONE)
        np.copyto(_bytes(outputs[self.rank]), _bytes(inputs[self.rank]))
        eng.step([Expect(p, F.DATA, CMA_DONE, 0) for p in cma_out])

    def barrier(self):
        algo = self._algo("barrier")
        if algo is not None:
            return self.sched.barrier(algo)
        peers = self.peers
        self.eng.open_links(peers)
        for p in peers:
            self.eng.send(p, 0)
        self.eng.step([Expect(p, F.DATA, 0, 0) for p in peers])
