"""What the two ends of a collective link agree on when it opens.

A collective link is opened by whichever rank first needs it (``Mesh.collective_link``).
After the hello, the dialer sends an *offer* and the listener answers with a
*reply*; from the two, each end derives the same ``Facts`` for the pair:

* ``rings``: frames go through the shared-memory ring pair: both ends are on one
  host, offer rings, and each has allocated its ring towards the other (a ring is
  allocated only when its link opens: ``RingFile.reserve``);
* ``read_pid``: this rank reads the peer's buffers itself (``process_vm_readv``),
  probed now against the peer's published token (the dialer from the store's
  facts, the listener from those in the offer);
* ``they_read``: the peer reads ours.

Offer: flags (``SAME``: one host, by the dialer's view of the host ids; ``RING``:
the dialer's ring to the listener is allocated; ``READS``: the dialer reads the
listener; ``CMA``: the listener may probe the dialer), the dialer's pid, and its
probe buffer's address and token. Reply: ``A`` (this dial is the pair's link) or
``R`` (refused: the listener's own dial is), and flags (``RING``, ``READS``).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from . import _cma

__all__ = ["Facts", "OFFER", "REPLY", "REFUSE", "offer", "answer", "reply", "facts", "recv_exact"]

OFFER = struct.Struct("<BIQ16s")
REPLY = struct.Struct("<cB")
SAME, RING, READS, CMA = 1, 2, 4, 8
REFUSE = REPLY.pack(b"R", 0)


class Facts(NamedTuple):
    rings: bool
    read_pid: int | None  # the peer's pid when this rank reads its memory
    they_read: bool


def recv_exact(sock, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        got = sock.recv(n - len(buf))
        if not got:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += got
    return bytes(buf)


def _same(mesh, info: dict) -> bool:
    return (mesh.info.get("transport") != "tcp" and info["hostid"] == mesh.hostid
            and info.get("pidns") == mesh.pidns)  # (peers map files through /proc/<pid>/fd)


def _can_read(mesh, peer: int, pid: int, probe) -> bool:
    """Whether this rank reads ``peer``'s memory: probed once per peer (a pair whose
    ranks dialled each other at once opens twice; the probe stays one)."""
    with mesh._reads_lock:  # the dialing thread and the acceptor thread may ask at once
        got = mesh._reads.get(peer)
        if got is None:
            got = mesh._reads[peer] = _cma.can_read(pid, probe)
    return got


def offer(mesh, peer: int) -> bytes:
    """The dialer's offer to ``peer`` (allocates this rank's ring to it where both offer rings)."""
    info = mesh.peer(peer)
    flags, addr, token = 0, 0, b"\0" * 16
    if _same(mesh, info):
        flags |= SAME
        if int(info.get("ring") or 0) and mesh.ring_for is not None and mesh.ring_for(peer):
            flags |= RING
        if mesh.cma_mode:
            flags |= CMA
            addr, token = int(mesh.info["cma"][0]), bytes.fromhex(mesh.info["cma"][1])
            if info.get("transport") == "auto" and info.get("cma") is not None and \
                    _can_read(mesh, peer, int(info["pid"]), info["cma"]):
                flags |= READS
    mesh._offers[peer] = flags
    return OFFER.pack(flags, mesh.info["pid"], addr, token)


def answer(mesh, rank: int, raw: bytes) -> Facts:
    """The listener's side (its acceptor thread): what it agrees to with dialer ``rank``;
    its reply is ``reply(facts)``."""
    flags, pid, addr, token = OFFER.unpack(raw)
    mine = 0
    if flags & SAME and mesh.info.get("transport") != "tcp":
        if flags & RING and int(mesh.info.get("ring") or 0) and mesh.ring_for is not None and mesh.ring_for(rank):
            mine |= RING
        if flags & CMA and mesh.cma_mode and _can_read(mesh, rank, pid, [addr, token.hex()]):
            mine |= READS
    mesh._offers[rank] = mine
    return Facts(bool(mine & RING), pid if mine & READS else None, bool(flags & READS))


def reply(f: Facts) -> bytes:
    return REPLY.pack(b"A", (RING if f.rings else 0) | (READS if f.read_pid is not None else 0))


def facts(mesh, peer: int, raw: bytes) -> Facts | None:
    """The dialer's side, from the listener's reply; None when it refused."""
    code, theirs = REPLY.unpack(raw)
    if code != b"A":
        return None
    mine = mesh._offers.get(peer, 0)
    return Facts(bool(mine & RING and theirs & RING), int(mesh.peer(peer)["pid"]) if mine & READS else None,
                 bool(theirs & READS))
