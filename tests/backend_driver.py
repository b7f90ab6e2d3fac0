"""Call a backend by hand, in the positional style of the public functions.

Backends take one ``Call`` record per operation (``ndist.collectives.Call``);
tests that drive a real backend directly (threads with their own sockets, the
MPI backend under mpiexec, the staging wrapper) build those records here:
``Driver(backend).all_reduce(buf, ReduceOp.SUM, blocking=True)`` is
``backend.all_reduce(Call(Op.ALL_REDUCE, ..., out=buf, redop=ReduceOp.SUM), blocking=True)``.
Every other attribute is the backend's own.
"""

from __future__ import annotations

import numpy as np

from ndist.collectives import Call, Op, ReduceOp


def _device(arr) -> str:
    return "cpu" if arr is None or isinstance(arr, np.ndarray) else "cuda"


class Driver:
    def __init__(self, backend) -> None:
        object.__setattr__(self, "backend", backend)

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def __setattr__(self, name, value):
        setattr(self.backend, name, value)

    def _call(self, op: Op, ref, **fields) -> Call:
        return Call(op, _device(ref), None if ref is None else ref.dtype, **fields)

    # ------------------------------------------------------------------ ops
    def all_reduce(self, buf, op=ReduceOp.SUM, scale=None, **kw):
        return self.backend.all_reduce(self._call(Op.ALL_REDUCE, buf, out=buf, redop=op, scale=scale), **kw)

    def reduce(self, buf, dst, op=ReduceOp.SUM, scale=None, **kw):
        return self.backend.reduce(self._call(Op.REDUCE, buf, out=buf, root=dst, redop=op, scale=scale), **kw)

    def reduce_scatter(self, out, inputs, op=ReduceOp.SUM, scale=None, **kw):
        return self.backend.reduce_scatter(self._call(Op.REDUCE_SCATTER, out, out=out, inputs=list(inputs),
                                                      redop=op, scale=scale), **kw)

    def reduce_scatter_from(self, out, inp, op=ReduceOp.SUM, scale=None, in_splits=None, **kw):
        return self.backend.reduce_scatter_from(self._call(Op.REDUCE_SCATTER_FROM, out, out=out, inp=inp,
                                                           in_splits=in_splits, redop=op, scale=scale), **kw)

    def broadcast(self, buf, src, **kw):
        return self.backend.broadcast(self._call(Op.BROADCAST, buf, out=buf, root=src), **kw)

    def all_gather(self, outputs, inp, **kw):
        return self.backend.all_gather(self._call(Op.ALL_GATHER, inp, inp=inp, outputs=list(outputs)), **kw)

    def all_gather_into(self, out, inp, out_splits=None, **kw):
        return self.backend.all_gather_into(self._call(Op.ALL_GATHER_INTO, inp, out=out, inp=inp,
                                                       out_splits=out_splits), **kw)

    def gather(self, outputs, inp, dst, **kw):
        return self.backend.gather(self._call(Op.GATHER, inp, inp=inp, root=dst,
                                              outputs=None if outputs is None else list(outputs)), **kw)

    def scatter(self, out, inputs, src, **kw):
        return self.backend.scatter(self._call(Op.SCATTER, out, out=out, root=src,
                                               inputs=None if inputs is None else list(inputs)), **kw)

    def all_to_all(self, outputs, inputs, **kw):
        ref = (list(inputs) or list(outputs) or [None])[0]
        return self.backend.all_to_all(self._call(Op.ALL_TO_ALL, ref, outputs=list(outputs), inputs=list(inputs)),
                                       **kw)

    def all_to_all_single(self, out, inp, out_splits=None, in_splits=None, **kw):
        return self.backend.all_to_all_single(self._call(Op.ALL_TO_ALL_SINGLE, inp, out=out, inp=inp,
                                                         out_splits=out_splits, in_splits=in_splits), **kw)

    def barrier(self, **kw):
        return self.backend.barrier(Call(Op.BARRIER, "cpu"), **kw)

    def send(self, buf, dst, tag=0, **kw):
        return self.backend.send(self._call(Op.SEND, buf, out=buf, root=dst, tag=tag), **kw)

    def recv(self, buf, src=None, tag=0, **kw):
        return self.backend.recv(self._call(Op.RECV, buf, out=buf, root=src, tag=tag), **kw)

    def __repr__(self) -> str:
        return f"Driver({self.backend!r})"
