"""The two engines a socket backend runs its collectives on, behind one interface, and
the one place that chooses between them.

* **The Python engine** (``engine/``): ``Algorithms`` over ``CollectiveStreams``, non-blocking
  streams per peer (TCP, Unix sockets, rings, segments, CMA). It runs every group, and is
  the reference the conformance suite holds the native engine to.
* **The native engine** (``native/``): ``NativeAlgorithms`` over a compiled ``_cnative``
  group, one call into C per collective with the GIL released. Over shared memory
  (``Group``, ``NATIVE``) it runs a group whose ranks are all on this host and all offer
  native slots of one size; over the group's TCP streams (``TcpGroup``, ``NATIVE_TCP``) a
  group that spans hosts whose ranks all offer it (``NDIST_NATIVE_TCP``,
  ``native/_engine.tcp_offer``), up to ``TCP_MAX_RANKS`` ranks; when such a group has more
  than one rank on some host and every rank offers native slots of one size, in two levels
  (``NATIVE_TWO``, ``native/_twolevel.py``): shared memory inside a host, the TCP engine
  between one leader per host.

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

__all__ = ["CollectiveEngine", "select", "NATIVE", "NATIVE_TCP", "NATIVE_TWO", "PYTHON"]

NATIVE, NATIVE_TCP, NATIVE_TWO, PYTHON = "native", "native-tcp", "native-two-level", "python"


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


def select(slot: int, peers, same_host: dict, published: dict, tcp: str = "", spans: bool = False,
           tcp_max: int = 8, hosts=None) -> str:
    """``NATIVE``, ``NATIVE_TCP``, ``NATIVE_TWO`` or ``PYTHON``: the engine a group runs its
    collectives on.

    ``slot``: the native slot bytes this rank offers (0: it offers no native engine);
    ``peers``: the other group ranks; ``same_host``: peer -> on this rank's host
    (``Links.same_host``); ``published``: peer -> what it published (its ``native`` slot
    bytes, 0 when it offers none; ``native_tcp``, its TCP offer); ``tcp``: this rank's TCP
    offer (``native/_engine.tcp_offer``: ``""`` none, ``"auto"``, ``"always"``); ``spans``:
    the group's ranks are on more than one host (by host identity: alike on every rank);
    ``tcp_max``: the most ranks for the TCP engine; ``hosts``: the host index of every group
    rank (alike on every rank), when the group spans hosts.

    ``NATIVE`` when the group does not span hosts, this rank offers slots and every peer is
    on this host and offers slots of the same size; else ``NATIVE_TCP`` when the group has
    at most ``tcp_max`` ranks, every rank offers the TCP engine, and the group spans hosts or
    every offer is ``"always"`` -- ``NATIVE_TWO`` instead when it spans hosts, some host has
    more than one of its ranks, and every rank offers slots of this rank's size; else
    ``PYTHON``. Every rank decides from the same published facts, so all decide alike (a
    rank's own slot and TCP offer are what it published)."""
    if not spans and slot and all(same_host.get(p) and published[p].get("native") == slot for p in peers):
        return NATIVE
    offers = [tcp] + [published[p].get("native_tcp") or "" for p in peers]
    if len(offers) <= tcp_max and all(offers) and (spans or all(o == "always" for o in offers)):
        if spans and hosts is not None and len(set(hosts)) < len(hosts) and slot and all(
                published[p].get("native") == slot for p in peers):
            return NATIVE_TWO
        return NATIVE_TCP
    return PYTHON
