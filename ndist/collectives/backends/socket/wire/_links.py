"""How this rank moves a collective's bytes to each peer: one decision per backend.

The group-wide choices are made once, at the first collective, from facts every
rank published in the store (host id, transport mode, core count); the per-pair
ones (rings, CMA) when the pair's link opens, from what both ends said in its
opening (``wire/_link_facts``), so both ends of a pair agree:

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

from .....runtime import DistNetworkError
from . import _ring

__all__ = ["Links", "setup", "attach", "topology"]

log = logging.getLogger("ndist.collectives.socket")

NO_CHUNKS = 1 << 62


def topology(hostids) -> tuple:
    """``hostids[r]`` (any hashable) for each rank -> the host index of each rank,
    hosts numbered in order of their lowest rank."""
    index: dict = {}
    return tuple(index.setdefault(h, len(index)) for h in hostids)


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
        self.hosts: tuple | None = None  # host index of every rank (``topology``), any transport

    def shm(self, peer: int, nbytes: int) -> bool:
        return nbytes >= self.shm_min and self.same_host.get(peer, False)


def setup(links: Links, mesh, rank: int, size: int, mode: str, chunk: int) -> None:
    """The group-wide facts, from what every rank published: which peers share this
    host, the topology, and whether large reductions pipeline. No link opens here."""
    peers = [p for p in range(size) if p != rank]
    mesh.prefetch()
    for p in peers:
        # (shared memory also needs one pid namespace: peers map files through /proc/<pid>/fd)
        links.same_host[p] = (mode != "tcp" and mesh.peer(p)["hostid"] == mesh.hostid
                              and mesh.peer(p).get("pidns") == mesh.pidns)
    links.hosts = topology(mesh.hostid if p == rank else mesh.peer(p)["hostid"] for p in range(size))
    # Pipelining pays when every rank has a core and shares the cache; every
    # rank computes this from the same published facts, so all agree.
    infos = [mesh.info] + [mesh.peer(p) for p in peers]
    links.pipeline = (all(i["hostid"] == mesh.hostid for i in infos)
                      and all(size <= i.get("ncpu", 1) for i in infos))
    links.chunk = chunk if links.pipeline else NO_CHUNKS


def attach(links: Links, eng, conn, facts, mesh, rank: int, size: int, rings, group_name: str) -> None:
    """A collective link to ``conn.peer`` just opened: wire the paths both ends agreed
    on (``wire/_link_facts.Facts``): its rings and CMA in each direction."""
    p = conn.peer
    if facts.read_pid is not None:
        links.cma_from[p] = facts.read_pid
        eng.cma_pids[p] = facts.read_pid
    if facts.they_read:
        links.cma_to.add(p)
    if facts.rings and rings is not None:
        info = mesh.peer(p)
        try:
            theirs = _ring.RingFile(_ring.path_for(info["shm"]), size, int(info["ring"]), create=False)
        except (OSError, ValueError) as err:
            raise DistNetworkError(f"group {group_name!r}: cannot map rank {mesh.granks[p]}'s shared-memory rings: "
                                   f"{err}", rank=mesh.granks[p], host=mesh.host_of(p)) from None
        conn.ring_out = rings.ring(p)
        conn.ring_in = theirs.ring(rank)
        links.rings.append(p)
    log.debug("rank %d: link to rank %d: rings %s, reads it %s, read by it %s", rank, p, facts.rings,
              facts.read_pid is not None, facts.they_read)
