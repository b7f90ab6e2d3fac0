"""Shared-memory byte rings between two ranks of one host: the collective
stream of a pair without a system call per frame.

Each rank owns one file (``<shm prefix>-ring``) holding one single-producer
single-consumer ring per destination rank. The owner writes frames into the ring
of a peer; that peer maps the file and reads its ring. The file is unlinked from
``/dev/shm`` as soon as it is made; the owner keeps a descriptor, through which
peers map it (``_shmfiles.open_shared``), until it closes the group.
The ring replaces the socket's byte stream for that direction exactly (same
frames, same order), so the engine's framing, checks and failure handling are
unchanged. The socket stays open: it carries one-byte doorbells to a reader
that went to sleep in ``poll``, and its end-of-file is how the death of the
writer is seen.

Layout of one ring (all counters are byte totals, never reset)::

    0    head   u64  bytes written   (writer)
    64   tail   u64  bytes consumed  (reader)
    128  sleep  u64  reader is about to block in poll: ring the doorbell (reader)
    256  data   ``capacity`` bytes

Ordering: the writer copies the bytes, then stores ``head``; the reader loads
``head``, then copies. x86-64 keeps stores in order and loads in order (TSO),
which is all this needs; the rings are only used there. The sleep handshake
(reader: store ``sleep``, load ``head``; writer: store ``head``, load
``sleep``) also needs the store before the load, which TSO does not promise:
both sides put a locked instruction between them (a ``threading.Lock``
round trip), and the reader never sleeps longer than ``MAX_SLEEP_S`` anyway.
"""

from __future__ import annotations

import logging
import mmap
import os
import platform
import threading

from .....runtime import _shmfiles
from ._segment import SHM_DIR, job_of

__all__ = ["available", "capacity_from_env", "path_for", "RingFile", "Ring", "MAX_SLEEP_S", "RING_ENV",
           "OLD_RING_ENV"]

RING_ENV = "NDIST_RING"
#: the variable's name before "ring" became the rings' one word (``shm`` named all three
#: shared-memory mechanisms): still read when ``NDIST_RING`` is unset, with one
#: deprecation line in the log
OLD_RING_ENV = "NDIST_SHM_RING"
_told_old: list = []
#: default bytes per ring: several inline frames (inline payloads are < 32 KiB),
#: fewer in big groups so that one rank's rings stay within ``_BUDGET``
DEFAULT_CAPACITY = 256 << 10
_MIN_DEFAULT = 64 << 10
_BUDGET = 4 << 20
_CTRL = 256
_HEAD, _TAIL, _SLEEP = 0, 8, 16  # u64 indexes
#: longest a reader blocks in poll before it looks at its rings again (covers a
#: doorbell the writer did not send)
MAX_SLEEP_S = 0.005
_fence_lock = threading.Lock()
log = logging.getLogger("ndist.collectives.socket")


def _fence() -> None:
    # a lock round trip is a locked read-modify-write: a full barrier on x86-64
    _fence_lock.acquire()
    _fence_lock.release()


def available() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64") and os.path.isdir(SHM_DIR)


def path_for(shm_prefix: str) -> str:
    """The ring file of the rank whose shared-memory prefix is ``shm_prefix``."""
    return os.path.join(SHM_DIR, shm_prefix + "-ring")


def capacity_from_env(size: int = 2) -> int:
    """Bytes per ring from ``NDIST_RING`` (0 turns rings off; its old name
    ``NDIST_SHM_RING`` is read when it is unset); if unset, the default for a group of
    ``size`` ranks (256 KiB, less above 16 ranks: 4 MiB per rank)."""
    name = RING_ENV
    raw = os.environ.get(RING_ENV)
    if raw is None and os.environ.get(OLD_RING_ENV) is not None:
        name, raw = OLD_RING_ENV, os.environ[OLD_RING_ENV]
        if not _told_old:
            _told_old.append(True)
            log.warning("%s is deprecated: set %s instead (same meaning)", OLD_RING_ENV, RING_ENV)
    raw = (raw or "").strip()
    if not raw:
        return max(_MIN_DEFAULT, min(DEFAULT_CAPACITY, _BUDGET // max(size, 1) // 4096 * 4096))
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}: expected a byte count (0 turns the rings off), got {raw!r}") from None
    if value < 0 or (value and value < 4096):
        raise ValueError(f"{name}: expected 0 or at least 4096 bytes, got {value}")
    return value


class Ring:
    """One direction of one pair: ``write`` (owner side) or ``read`` (peer side)."""

    __slots__ = ("ctl", "data", "cap", "pos", "_mm")

    def __init__(self, mm, offset: int, capacity: int) -> None:
        self._mm = mm
        base = memoryview(mm)[offset: offset + _CTRL + capacity]
        self.ctl = base[:_CTRL].cast("Q")
        self.data = base[_CTRL:]
        self.cap = capacity
        # this side's own counter (head for the writer, tail for the reader), kept
        # locally: only this side changes it
        self.pos = 0

    # ----------------------------------------------------------- writer
    def write(self, out) -> tuple[int, bool]:
        """Copy what fits of the memoryviews in deque ``out`` (consumed in place);
        return ``(bytes written, reader asleep)``."""
        head = self.pos
        free = self.cap - (head - self.ctl[_TAIL])
        written = 0
        data, cap = self.data, self.cap
        while out and free:
            mv = out[0]
            n = len(mv)
            if n > free:
                n = free
            at = head % cap
            first = min(n, cap - at)
            data[at: at + first] = mv[:first]
            if first < n:
                data[: n - first] = mv[first:n]
            head += n
            free -= n
            written += n
            if n == len(mv):
                out.popleft()
            else:
                out[0] = mv[n:]
        if not written:
            return 0, False
        self.pos = head
        self.ctl[_HEAD] = head
        _fence()
        return written, bool(self.ctl[_SLEEP])

    # ----------------------------------------------------------- reader
    def available(self) -> int:
        return self.ctl[_HEAD] - self.pos

    def read_into(self, view) -> int:
        """Copy up to ``len(view)`` bytes into ``view``; 0 when the ring is empty."""
        tail = self.pos
        n = self.ctl[_HEAD] - tail
        if n <= 0:
            return 0
        if n > len(view):
            n = len(view)
        cap = self.cap
        at = tail % cap
        first = min(n, cap - at)
        view[:first] = self.data[at: at + first]
        if first < n:
            view[first:n] = self.data[: n - first]
        tail += n
        self.pos = tail
        self.ctl[_TAIL] = tail
        return n

    def sleep(self) -> bool:
        """About to block: raise the flag, then True if data came meanwhile (don't block)."""
        self.ctl[_SLEEP] = 1
        _fence()
        if self.ctl[_HEAD] != self.pos:
            self.ctl[_SLEEP] = 0
            return True
        return False

    def wake(self) -> None:
        self.ctl[_SLEEP] = 0


class RingFile:
    """This rank's rings (one per destination) or a mapping of a peer's file."""

    def __init__(self, path: str, size: int, capacity: int, create: bool) -> None:
        self.path = path
        self.capacity = capacity
        self.stride = _CTRL + capacity
        name = os.path.basename(path)
        # no name in /dev/shm: the owner's descriptor (``_fd``) is how peers map it
        fd = (_shmfiles.create_unlinked(name, job_of(name)) if create
              else _shmfiles.open_shared(name, _shmfiles.owner_pid(name)))
        self._mm = None
        self._fd = -1
        try:
            if create:
                # sparse: each ring is allocated when its link opens (``reserve``)
                os.ftruncate(fd, size * self.stride)
            elif os.fstat(fd).st_size < size * self.stride:
                raise ValueError(f"{path}: ring file is smaller than {size} rings of {capacity} bytes")
            self._mm = (_shmfiles.map_owned if create else mmap.mmap)(fd, size * self.stride)
        except BaseException:
            if create:
                _shmfiles.release(name, fd)
            else:
                os.close(fd)
            raise
        if create:
            self._fd = fd
        else:
            os.close(fd)

    def reserve(self, index: int) -> bool:
        """Allocate ring ``index`` (this rank's ring to that peer) before its first use:
        False when /dev/shm is full (that pair then uses its socket), instead of
        SIGBUS on the first write to a page. Any thread."""
        fd = self._fd
        if fd < 0:
            return False  # (closed)
        try:
            os.posix_fallocate(fd, index * self.stride, self.stride)
            return True
        except OSError as err:
            log.warning("no shared-memory rings with peer %d (%s); that pair's collectives use its socket", index,
                        err)
            return False

    def ring(self, index: int) -> Ring:
        return Ring(self._mm, index * self.stride, self.capacity)

    def unlink(self) -> None:
        """Stop sharing: close the descriptor peers map the file through (their mappings stay)."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            _shmfiles.release(os.path.basename(self.path), fd)
