"""How this rank moves a collective's bytes to each peer: one decision per backend.

Every choice is made once, when the first collective connects the group, from
facts every rank published in the store (host id, transport mode, core count,
ring size, what memory each can read), so both ends of a pair agree:

* ``shm(peer, nbytes)``: a payload this large to this peer goes by reference
  into our shared-memory segment (same host; ``NDIST_TRANSPORT=shm``: any size);
* rings: frames to a same-host peer that also offers rings go through the
  shared-memory ring pair instead of the socket (set on the engine's
  connection: ``conn.ring_out`` / ``conn.ring_in``);
* ``cma_to``: peers that read our buffers themselves (``process_vm_readv``);
  ``cma_from``: peers whose memory we read, by pid;
* ``pipeline`` / ``chunk``: the whole group is on one host with a core per
  rank, so large reductions go in ``chunk``-byte rounds.
"""

from __future__ import annotations

import logging

from ....runtime import DistNetworkError
from . import _cma, _ring
from ._twolevel import topology

__all__ = ["Links", "connect"]

log = logging.getLogger("ndist.collectives.socket")

NO_CHUNKS = 1 << 62


class Links:
    """The per-peer transport choice of one backend (see the module docstring)."""

    __slots__ = ("shm_min", "same_host", "cma_to", "cma_from", "rings", "pipeline", "chunk", "hosts")

    def __init__(self, shm_min: int) -> None:
        self.shm_min = shm_min
        self.same_host: dict[int, bool] = {}  # peer -> payloads may go through shared memory
        self.cma_to: set[int] = set()
        self.cma_from: dict[int, int] = {}  # peer -> pid (the engine reads with it)
        self.rings: list[int] = []
        self.pipeline = False
        self.chunk = NO_CHUNKS
        self.hosts: tuple | None = None  # host index of every rank (_twolevel.topology), any transport

    def shm(self, peer: int, nbytes: int) -> bool:
        return nbytes >= self.shm_min and self.same_host.get(peer, False)


def connect(links: Links, eng, mesh, store, rank: int, size: int, mode: str, rings, chunk: int,
            group_name: str) -> None:
    """Decide every peer's path for ``eng``'s connections and wire the rings and CMA."""
    peers = list(eng.conns)
    for p in peers:
        links.same_host[p] = mode != "tcp" and mesh.peer(p)["hostid"] == mesh.hostid
    links.hosts = topology(mesh.hostid if p == rank else mesh.peer(p)["hostid"] for p in range(size))
    # Pipelining pays when every rank has a core and shares the cache; every
    # rank computes this from the same published facts, so all agree.
    infos = [mesh.info] + [mesh.peer(p) for p in peers]
    links.pipeline = (all(i["hostid"] == mesh.hostid for i in infos)
                      and all(size <= i.get("ncpu", 1) for i in infos))
    links.chunk = chunk if links.pipeline else NO_CHUNKS
    _connect_cma(links, eng, mesh, store, rank, mode)
    _connect_rings(links, eng, mesh, rank, size, rings, group_name)


def _connect_rings(links: Links, eng, mesh, rank: int, size: int, rings, group_name: str) -> None:
    """Same-host pairs where both ranks offer rings exchange frames through them."""
    if rings is None:
        return
    for p, conn in eng.conns.items():
        info = mesh.peer(p)
        cap = int(info.get("ring") or 0)
        if not cap or not links.same_host.get(p):
            continue
        try:
            theirs = _ring.RingFile(_ring.path_for(info["shm"]), size, cap, create=False)
        except (OSError, ValueError) as err:
            raise DistNetworkError(f"group {group_name!r}: cannot map rank {mesh.granks[p]}'s shared-memory rings: "
                                   f"{err}", rank=mesh.granks[p], host=mesh.host_of(p)) from None
        conn.ring_out = rings.ring(p)
        conn.ring_in = theirs.ring(rank)
        links.rings.append(p)
    if links.rings:
        log.debug("rank %d: shared-memory rings with ranks %s", rank, links.rings)


def _has_cma(info: dict) -> bool:
    return info.get("transport") == "auto" and info.get("cma") is not None


def _connect_cma(links: Links, eng, mesh, store, rank: int, mode: str) -> None:
    """Probe which same-host peers' memory we can read; learn who can read ours.

    Only in ``auto`` mode (``shm`` / ``tcp`` keep their single path). Both sides
    of a pair must agree, so each rank publishes what it can read and a sender
    names its buffer only to peers that said they can read it.
    """
    if mode != "auto" or mesh.info.get("cma") is None:
        return
    same = [p for p in eng.conns if links.same_host.get(p)]
    for p in same:
        info = mesh.peer(p)
        if _cma.can_read(int(info["pid"]), info.get("cma")):
            links.cma_from[p] = int(info["pid"])
    eng.cma_pids = links.cma_from
    store.set(f"sock/cma/{rank}", ",".join(map(str, sorted(links.cma_from))).encode())
    for p in same:
        if _has_cma(mesh.peer(p)):
            mesh.wait_published(f"sock/cma/{p}", p)  # (fails at once if a member is known dead)
            readable = store.get(f"sock/cma/{p}").decode()
            if str(rank) in readable.split(","):
                links.cma_to.add(p)
    if same:
        log.debug("rank %d reads peers %s directly; peers %s read ours", rank, sorted(links.cma_from),
                  sorted(links.cma_to))

