"""Shared-memory segments of the socket backend.

Each backend owns one growing segment that it writes the payloads of large
messages into; peers on the same host map it and read (or reduce) straight
from it. A generation is made in ``/dev/shm`` and unlinked at once
(``_shmfiles.create_unlinked``): the owner keeps a descriptor until it grows
or closes, a peer maps it through ``/proc/<owner pid>/fd`` on the first
reference to it (the engine's op that first references a generation to a peer
returns once that peer acknowledged reading it, so the owner's death cannot
take the data from it: ``_engine._await_mapped``), and nothing is left in
``/dev/shm`` whatever ends the ranks. Names carry a job-unique prefix
(``ndist-<job>-<group>-r<rank>-p<pid>-i<instance>-g<generation>``); a new
backend also unlinks files of its job that an older ndist left named and
whose owner pid no longer exists (see ``ndist.runtime._shmfiles``).
"""

from __future__ import annotations

import logging
import mmap
import os
import weakref

import numpy as np

from .....runtime import _shmfiles
from .....runtime._shmfiles import SHM_DIR, job_prefix, sweep_dead, unlink_prefix

__all__ = ["SHM_DIR", "job_prefix", "job_of", "OwnSegment", "PeerSegments", "unlink_prefix", "sweep_dead"]

log = logging.getLogger("ndist.collectives.socket")

_MIN_SEGMENT = 1 << 20


def _unlink(names: list) -> None:
    """Stop sharing: ``_shmfiles.release`` each (name, descriptor); peers' mappings stay valid."""
    for name, fd in list(names):
        _shmfiles.release(name, fd)
    names.clear()


def job_of(prefix: str) -> str:
    """``ndist-<job>`` of a segment prefix ``ndist-<job>-<group>-r...``."""
    return "-".join(prefix.split("-")[:2])


class OwnSegment:
    """This rank's segment: ``reserve(n)`` makes ``buf`` (uint8) at least ``n`` bytes.

    Growing creates a new generation and unlinks the previous one; callers
    only grow between operations, once every peer acknowledged its reads.
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        # every backend's start, whatever its transport: segments and rings of this
        # job whose owner is dead (a SIGKILLed rank, an earlier attempt) go now
        n = sweep_dead(job_of(prefix))
        if n:
            log.info("unlinked %d shared-memory file(s) left by dead processes of this job", n)
        self.gen = 0
        self.buf: np.ndarray | None = None
        self._mm: mmap.mmap | None = None
        self._names: list = []  # (name, descriptor) of the current generation, shared with the finalizer
        self._finalizer = weakref.finalize(self, _unlink, self._names)

    @property
    def name(self) -> str:
        return f"{self.prefix}-g{self.gen}"

    @property
    def capacity(self) -> int:
        return 0 if self.buf is None else self.buf.nbytes

    def reserve(self, nbytes: int) -> None:
        if nbytes <= self.capacity:
            return
        size = max(_MIN_SEGMENT, 1 << (int(nbytes) - 1).bit_length())
        self.release()
        self.gen += 1
        name = self.name
        fd = _shmfiles.create_unlinked(name, job_of(self.prefix))
        try:
            os.ftruncate(fd, size)
            self._mm = _shmfiles.map_owned(fd, size)
        except BaseException:
            _shmfiles.release(name, fd)
            raise
        self._names.append((name, fd))  # open while peers may map this generation
        self.buf = np.frombuffer(self._mm, dtype=np.uint8)
        log.debug("segment %s: %d bytes", name, size)

    def release(self) -> None:
        """Stop sharing the current generation (mappings die with their last view)."""
        _unlink(self._names)
        self.buf = None
        self._mm = None  # closed by GC once peers' views into it are gone

    def close(self) -> None:
        self.release()


class PeerSegments:
    """Maps peers' segments on demand, keeping the newest generation per peer."""

    def __init__(self) -> None:
        self._maps: dict[int, tuple[int, np.ndarray]] = {}

    def view(self, peer: int, prefix: str, gen: int, offset: int, nbytes: int) -> np.ndarray:
        cached = self._maps.get(peer)
        if cached is None or cached[0] != gen:
            name = f"{prefix}-g{gen}"
            fd = _shmfiles.open_shared(name, _shmfiles.owner_pid(prefix))
            try:
                size = os.fstat(fd).st_size
                mm = mmap.mmap(fd, size)
            finally:
                os.close(fd)
            cached = (gen, np.frombuffer(mm, dtype=np.uint8))
            self._maps[peer] = cached
        buf = cached[1]
        if offset + nbytes > buf.nbytes:
            raise ValueError(
                f"shared-memory reference [{offset}:{offset + nbytes}] is outside the peer's "
                f"{buf.nbytes}-byte segment"
            )
        return buf[offset : offset + nbytes]

    def drop(self, peer: int) -> None:
        self._maps.pop(peer, None)

    def clear(self) -> None:
        self._maps.clear()
