"""TEST-ONLY backend: collectives carried through the group's store.

It exists so that the process-group tests of the runtime layer exercise the
real registry -> BackendContext -> backend path before the socket / mpi
backends are merged. It is slow (every byte goes through the store) and lives
in tests/ only; never import it from ndist/.
"""

from __future__ import annotations

import numpy as np

from ndist.collectives import CollectiveBackend, ReduceOp
from ndist.runtime import Work, register_backend

NAME = "storetest"

_REDUCE = {
    ReduceOp.SUM: lambda xs: np.sum(xs, axis=0),
    ReduceOp.PRODUCT: lambda xs: np.prod(xs, axis=0),
    ReduceOp.MIN: lambda xs: np.min(xs, axis=0),
    ReduceOp.MAX: lambda xs: np.max(xs, axis=0),
    ReduceOp.AVG: lambda xs: np.mean(xs, axis=0),
}


class StoreBackend(CollectiveBackend):
    name = NAME

    def __init__(self, ctx):
        super().__init__(ctx)
        self.store = ctx.store
        self.seq = 0
        self._p2p: dict = {}
        self.closed = False

    def _next(self, op):
        self.seq += 1
        return f"{self.seq}/{op}"

    def _put(self, key, arr):
        self.store.set(key, np.ascontiguousarray(arr).tobytes())

    def _get(self, key, like):
        return np.frombuffer(self.store.get(key), dtype=like.dtype).reshape(like.shape)

    def _exchange(self, op, arr):
        base = self._next(op)
        self._put(f"{base}/{self.rank}", arr)
        return [self._get(f"{base}/{i}", arr) for i in range(self.size)]

    def all_reduce(self, call, *, blocking=False):
        buf, op = call.out, call.redop
        buf[...] = _REDUCE[op](np.stack(self._exchange("all_reduce", buf))).astype(buf.dtype)
        return Work.completed("all_reduce", self.seq)

    def reduce(self, call, *, blocking=False):
        buf, dst, op = call.out, call.root, call.redop
        vals = self._exchange("reduce", buf)
        if self.rank == dst:
            buf[...] = _REDUCE[op](np.stack(vals)).astype(buf.dtype)
        return Work.completed("reduce", self.seq)

    def reduce_scatter(self, call, *, blocking=False):
        out, inputs, op = call.out, call.inputs, call.redop
        base = self._next("reduce_scatter")
        for j, x in enumerate(inputs):
            self._put(f"{base}/{self.rank}/{j}", x)
        vals = [self._get(f"{base}/{i}/{self.rank}", out) for i in range(self.size)]
        out[...] = _REDUCE[op](np.stack(vals)).astype(out.dtype)
        return Work.completed("reduce_scatter", self.seq)

    def broadcast(self, call, *, blocking=False):
        buf, src = call.out, call.root
        base = self._next("broadcast")
        if self.rank == src:
            self._put(base, buf)
        else:
            buf[...] = self._get(base, buf)
        return Work.completed("broadcast", self.seq)

    def _collect(self, op, outputs, inp, here):
        """Every rank puts ``inp``; where ``here``, ``outputs[i]`` gets rank i's."""
        base = self._next(op)
        self._put(f"{base}/{self.rank}", inp)
        if here:
            for i, out in enumerate(outputs):
                out[...] = self._get(f"{base}/{i}", out)
        return Work.completed(op, self.seq)

    def all_gather(self, call, *, blocking=False):
        return self._collect("all_gather", call.outputs, call.inp, True)

    def gather(self, call, *, blocking=False):
        return self._collect("gather", call.outputs, call.inp, self.rank == call.root)

    def scatter(self, call, *, blocking=False):
        out, inputs, src = call.out, call.inputs, call.root
        base = self._next("scatter")
        if self.rank == src:
            for i, x in enumerate(inputs):
                self._put(f"{base}/{i}", x)
        out[...] = self._get(f"{base}/{self.rank}", out)
        return Work.completed("scatter", self.seq)

    def all_to_all(self, call, *, blocking=False):
        outputs, inputs = call.outputs, call.inputs
        base = self._next("all_to_all")
        for j, x in enumerate(inputs):
            self._put(f"{base}/{self.rank}/{j}", x)
        for i, out in enumerate(outputs):
            out[...] = self._get(f"{base}/{i}/{self.rank}", out)
        return Work.completed("all_to_all", self.seq)

    def barrier(self, call, *, blocking=False):
        base = self._next("barrier")
        if self.store.add(base, 1) == self.size:
            self.store.set(base + "/done", b"1")
        self.store.wait([base + "/done"])
        return Work.completed("barrier", self.seq)

    def send(self, call, *, blocking=False):
        buf, dst, tag = call.out, call.root, call.tag
        n = self._p2p[("s", dst, tag)] = self._p2p.get(("s", dst, tag), 0) + 1
        self._put(f"p2p/{self.rank}/{dst}/{tag}/{n}", buf)
        return Work.completed("send")

    def recv(self, call, *, blocking=False):
        buf, src, tag = call.out, call.root, call.tag
        if src is None:
            raise ValueError("src: the test store backend needs an explicit source")
        n = self._p2p[("r", src, tag)] = self._p2p.get(("r", src, tag), 0) + 1
        buf[...] = self._get(f"p2p/{src}/{self.rank}/{tag}/{n}", buf)
        return Work.completed("recv", outputs=[src])

    def close(self):
        self.closed = True


def create(ctx):
    return StoreBackend(ctx)


register_backend(NAME, create, devices=("cpu",))
