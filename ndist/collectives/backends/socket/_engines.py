"""The two engines a socket backend runs its collectives on, behind one interface, and
the one place that chooses between them.

* **The Python engine** (``engine/``): ``Algorithms`` over ``Engine``, non-blocking
  streams per peer (TCP, Unix sockets, rings, segments, CMA). It runs every group, and is
  the reference the conformance suite holds the native engine to.
* **The native engine** (``native/``): ``NativeAlgorithms`` over the compiled
  ``_cnative`` group, one call into C per collective with the GIL released. It runs a
  group whose ranks are all on this host and all offer native slots of one size.

Both implement ``CollectiveEngine``; the backend's op adapters call it
(``SocketBackend._alg``) without knowing which one runs. ``select`` makes the choice,
from facts every rank published in the store, so every rank chooses alike. (Whether a
rank *offers* the native engine at all, ``NDIST_ENGINE`` and the transport, is decided
when the backend is made, ``native/_engine.module_for``: its slot file must be
published before any peer looks.)

A blocking op on the native engine with nothing queued may instead take the thin lane
(``SocketBackend._inline`` with a ``NativeAlgorithms.lane_*`` method): the same op,
without a Work or an executor job.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["CollectiveEngine", "select", "NATIVE", "PYTHON"]

NATIVE, PYTHON = "native", "python"


class CollectiveEngine(Protocol):
    """One group's collectives, each run to its end on the calling thread (the backend's
    executor orders them). Buffers are NumPy arrays the public layer checked; ``op`` is a
    ``ReduceOp``, ``scale`` PREMUL_SUM's factor; ranks are group ranks. A failure raises
    the typed error (``DistError`` tree) and leaves the group broken or usable as the
    engine's failure rules say (docs/reliability.md)."""

    def all_reduce(self, buf, op, scale) -> None: ...

    def direct_reduce(self, buf, op, scale, root: int) -> None: ...

    def reduce_scatter(self, out, inputs, op, scale) -> None: ...

    def broadcast(self, buf, src: int) -> None: ...

    def all_gather(self, outputs, inp) -> None: ...

    def gather(self, outputs, inp, dst: int) -> None: ...

    def scatter(self, out, inputs, src: int) -> None: ...

    def all_to_all(self, outputs, inputs, even: bool = False) -> None: ...

    def barrier(self) -> None: ...


def select(slot: int, peers, same_host: dict, published: dict) -> str:
    """``NATIVE`` or ``PYTHON``: the engine a group runs its collectives on.

    ``slot``: the native slot bytes this rank offers (0: it offers no native engine);
    ``peers``: the other group ranks; ``same_host``: peer -> on this rank's host
    (``Links.same_host``); ``published``: peer -> what it published (its ``native`` slot
    bytes, 0 when it offers none). Native when this rank offers it and every peer is on
    this host and offers slots of the same size; every rank decides from the same
    published facts, so all decide alike."""
    if not slot:
        return PYTHON
    if all(same_host.get(p) and published[p].get("native") == slot for p in peers):
        return NATIVE
    return PYTHON
