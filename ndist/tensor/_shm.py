"""Shared-memory storage for CPU arrays.

A *segment* is one shared mapping that arrays are views of. Two sharing
strategies, as in ``torch.multiprocessing``:

``file_descriptor`` (Linux default)
    An anonymous ``memfd``. It has no name, so nothing can leak: the kernel
    frees it once the last descriptor and the last mapping are gone (also when
    a holder is killed). Other processes receive a duplicate of the descriptor
    over a Unix socket (``SCM_RIGHTS``), which ``ndist.multiprocessing`` does.

``file_system``
    A named file in ``/dev/shm`` called ``ndist_mp_<pid>_<ppid>_<seq>_<token>``
    (creator pid, its parent's pid). The name is reference counted:

    * every process that maps the segment keeps one descriptor on it with a
      shared ``flock``; the kernel drops that lock when the process exits or is
      killed, so a dead holder never counts;
    * a handle that is serialized but not yet opened (in flight) is counted in
      the segment's 64-byte header (``pin`` / ``unpin``), changed under a POSIX
      record lock on the header;
    * whoever drops the last local reference unlinks the name when no other
      process holds a lock and nothing is in flight.

    A handle still in flight when every holder is gone is reclaimed at exit by
    the creator (root process) or by the parent of a dead creator, see
    ``reclaim`` and ``_exit_hook``.

This module imports nothing of ndist.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import logging
import mmap
import os
import secrets
import sys
import threading
import weakref

import numpy as np

__all__ = [
    "STRATEGIES",
    "SEGMENT_PREFIX",
    "get_strategy",
    "set_strategy",
    "get_all_strategies",
    "share_array",
    "is_shared",
    "segment_of",
    "array_from_segment",
    "open_fd",
    "open_name",
    "pin",
    "unpin",
    "reclaim",
    "list_segments",
    "install_exit_hook",
]

log = logging.getLogger("ndist.tensor")

STRATEGIES = ("file_descriptor", "file_system")
SEGMENT_PREFIX = "ndist_mp_"
SHM_DIR = "/dev/shm"
_HEADER = 64  # file_system segments: bytes [8, 16) hold the in-flight count
_INFLIGHT = 8

_lock = threading.RLock()
_seq = itertools.count()
_strategy: str | None = None
_by_key: "weakref.WeakValueDictionary[tuple, _Segment]" = weakref.WeakValueDictionary()
_live: dict[int, "weakref.finalize"] = {}
_hook_pid: int | None = None
_afterfork_registered = False


def get_all_strategies() -> set[str]:
    """The strategies this system supports (a set, like torch)."""
    out = {"file_system"} if os.path.isdir(SHM_DIR) else set()
    if hasattr(os, "memfd_create"):
        out.add("file_descriptor")
    return out


def get_strategy() -> str:
    """The current strategy for new segments (``file_descriptor`` where the OS has memfd)."""
    global _strategy
    if _strategy is None:
        _strategy = "file_descriptor" if hasattr(os, "memfd_create") else "file_system"
    return _strategy


def set_strategy(name: str) -> None:
    """Set the strategy used by ``share_array`` from now on in this process."""
    valid = get_all_strategies()
    if not isinstance(name, str) or name not in valid:
        raise ValueError(f"new_strategy must be one of {sorted(valid)}, got {name!r}")
    global _strategy
    _strategy = name


class _Segment(mmap.mmap):
    """A shared mapping; arrays built on it have it at the end of their ``base`` chain.

    Attributes set after creation: ``strategy``, ``name`` (file_system) or ``None``,
    ``nbytes`` (usable bytes), ``data_offset`` (0, or the header size), ``key``
    (identity across processes), ``address`` (of the first byte) and ``_state``:
    ``{"fd": this process's descriptor (kept for re-sharing and, for file_system,
    as the holder lock) or -1 once released, "pid": the process holding it}``.
    """


def _new_segment(fd: int, strategy: str, name: str | None, nbytes: int, key: tuple) -> _Segment:
    total = nbytes + (_HEADER if strategy == "file_system" else 0)
    seg = _Segment(fd, max(total, 1), flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    seg.strategy = strategy
    seg.name = name
    seg.nbytes = nbytes
    seg.data_offset = _HEADER if strategy == "file_system" else 0
    seg.key = key
    seg.address = np.frombuffer(seg, dtype=np.uint8, count=1).__array_interface__["data"][0]
    state = {"fd": fd, "pid": os.getpid()}
    seg._state = state
    fin = weakref.finalize(seg, _release, state, strategy, name)
    fin.atexit = False  # the exit hook releases what is left, after children are joined
    _live[id(fin)] = fin
    state["fin_id"] = id(fin)
    _by_key[key] = seg
    install_exit_hook()
    return seg


def _reserve(fd: int, size: int, strategy: str) -> None:
    """Size the segment and allocate its pages now: a full tmpfs then raises
    here instead of killing the process with SIGBUS on first write."""
    os.ftruncate(fd, size)
    if size and hasattr(os, "posix_fallocate"):
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.ENOMEM):
                where = SHM_DIR if strategy == "file_system" else "shared memory (memfd)"
                raise MemoryError(
                    f"cannot allocate {size} bytes of {where} for a shared tensor: {e.strerror}; "
                    "free some, enlarge /dev/shm (e.g. docker --shm-size) or share smaller tensors"
                ) from None
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise


def _create_segment(nbytes: int, strategy: str) -> _Segment:
    seq = next(_seq)
    if strategy == "file_descriptor":
        fd = os.memfd_create(f"ndist_mp_{os.getpid()}_{seq}", os.MFD_CLOEXEC)
        try:
            _reserve(fd, max(nbytes, 1), strategy)
            st = os.fstat(fd)
            return _new_segment(fd, strategy, None, nbytes, ("fd", st.st_dev, st.st_ino))
        except BaseException:
            os.close(fd)
            raise
    name = f"{SEGMENT_PREFIX}{os.getpid()}_{os.getppid()}_{seq}_{secrets.token_hex(4)}"
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        _reserve(fd, nbytes + _HEADER, strategy)
        return _new_segment(fd, strategy, name, nbytes, ("name", name))
    except BaseException:
        os.close(fd)
        _unlink(name)
        raise


def _unlink(name: str) -> None:
    try:
        os.unlink(os.path.join(SHM_DIR, name))
        log.debug("unlinked shared segment %s", name)
    except FileNotFoundError:
        pass


def _read_inflight(fd: int) -> int:
    return int.from_bytes(os.pread(fd, 8, _INFLIGHT), "little", signed=True)


def _add_inflight(fd: int, delta: int) -> None:
    with _lock:
        fcntl.lockf(fd, fcntl.LOCK_EX, _HEADER, 0, os.SEEK_SET)
        try:
            value = max(_read_inflight(fd) + delta, 0)
            os.pwrite(fd, value.to_bytes(8, "little", signed=True), _INFLIGHT)
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN, _HEADER, 0, os.SEEK_SET)


def _unlink_if_unused(fd: int, name: str, ignore_inflight: bool) -> bool:
    """Unlink ``name`` if no process holds it (and nothing is in flight).

    ``fd`` is a descriptor on the segment whose own shared lock, if any, the
    caller has already dropped.
    """
    with _lock:
        fcntl.lockf(fd, fcntl.LOCK_EX, _HEADER, 0, os.SEEK_SET)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    return False  # another process maps it
                raise
            if not ignore_inflight and _read_inflight(fd) > 0:
                fcntl.flock(fd, fcntl.LOCK_UN)
                return False
            _unlink(name)
            return True
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN, _HEADER, 0, os.SEEK_SET)


def _release(state: dict, strategy: str, name: str | None, *, ignore_inflight: bool = False) -> None:
    """Drop this process's hold on a segment (its last local array is gone)."""
    _live.pop(state.get("fin_id"), None)
    fd = state["fd"]
    if fd < 0:
        return
    state["fd"] = -1
    try:
        if strategy == "file_system" and state["pid"] == os.getpid():
            fcntl.flock(fd, fcntl.LOCK_UN)
            _unlink_if_unused(fd, name, ignore_inflight)
    except OSError as e:  # never raise from a finalizer
        log.warning("releasing shared segment %s failed: %s", name, e)
    finally:
        os.close(fd)


def segment_of(arr) -> tuple[_Segment, int] | None:
    """``(segment, byte offset of arr's first element in the segment)`` or ``None``."""
    base = arr
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):  # np.frombuffer(memoryview(segment))
        base = base.obj
    if not isinstance(base, _Segment) or base.closed:
        return None
    return base, arr.__array_interface__["data"][0] - base.address - base.data_offset


def _is_device_array(arr) -> bool:
    return not isinstance(arr, np.ndarray) and hasattr(arr, "__cuda_array_interface__")


def is_shared(arr) -> bool:
    """True if ``arr`` lives in a shared segment (device arrays: always True, as in torch)."""
    if _is_device_array(arr):
        return True
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"arr must be a numpy.ndarray, got {type(arr).__name__}")
    return segment_of(arr) is not None


def share_array(arr) -> np.ndarray:
    """``arr`` itself if it is already shared, else a copy in a new shared segment.

    The copy has ``arr``'s shape and dtype and is C-contiguous. Device arrays are
    returned unchanged (CUDA memory is shared through IPC handles instead).
    """
    if _is_device_array(arr):
        return arr
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"arr must be a numpy.ndarray, got {type(arr).__name__}")
    if arr.dtype.hasobject:
        raise TypeError(f"arr must have a fixed-size dtype to be shared, got dtype {arr.dtype}")
    if segment_of(arr) is not None:
        return arr
    seg = _create_segment(arr.nbytes, get_strategy())
    out = np.ndarray(arr.shape, arr.dtype, buffer=seg, offset=seg.data_offset)
    np.copyto(out, arr, casting="no")
    return out


def array_from_segment(seg: _Segment, offset: int, shape, strides, dtype) -> np.ndarray:
    """A view of ``seg`` (offset in bytes from the start of the segment's data)."""
    return np.ndarray(tuple(shape), np.dtype(dtype), buffer=seg,
                      offset=seg.data_offset + offset, strides=tuple(strides))


def open_fd(fd: int, nbytes: int) -> _Segment:
    """Map a file_descriptor segment received from another process; takes ``fd``.

    A segment this process already maps (same inode) is reused and ``fd`` closed.
    """
    st = os.fstat(fd)
    if st.st_size < max(nbytes, 1):
        os.close(fd)
        raise ValueError(f"nbytes must be at most the segment's size {st.st_size}, got {nbytes}")
    key = ("fd", st.st_dev, st.st_ino)
    with _lock:
        seg = _by_key.get(key)
        if seg is not None and not seg.closed:
            os.close(fd)
            return seg
        try:
            return _new_segment(fd, "file_descriptor", None, nbytes, key)
        except BaseException:
            os.close(fd)
            raise


def open_name(name: str, nbytes: int) -> _Segment:
    """Map the file_system segment ``name`` (this process becomes a holder)."""
    if not isinstance(name, str) or "/" in name or _parse(name) is None:
        raise ValueError(f"name must be an ndist segment name like 'ndist_mp_<pid>_<ppid>_<n>_<hex>', got {name!r}")
    key = ("name", name)
    with _lock:
        seg = _by_key.get(key)
        if seg is not None and not seg.closed and seg._state["fd"] >= 0:
            return seg
        try:
            fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            raise RuntimeError(
                f"shared memory segment {name!r} no longer exists: every process holding it exited "
                "before this one opened it (keep the sending process and tensor alive until it is received)"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            size = os.fstat(fd).st_size
            if size < nbytes + _HEADER:
                raise ValueError(f"nbytes must be at most the segment's size {size - _HEADER}, got {nbytes}")
            return _new_segment(fd, "file_system", name, nbytes, key)
        except BaseException:
            os.close(fd)
            raise


def sharing_fd(seg: _Segment) -> int:
    """This process's descriptor of a file_descriptor segment (for ``DupFd``)."""
    fd = seg._state["fd"]
    if fd < 0:
        raise RuntimeError("shared memory segment was released at interpreter exit; it cannot be sent")
    return fd


def pin(seg: _Segment) -> None:
    """Count one in-flight handle of a file_system segment (sender side)."""
    fd = seg._state["fd"]
    if fd < 0 or seg._state["pid"] != os.getpid():
        raise RuntimeError(f"shared memory segment {seg.name!r} is not held by this process; it cannot be sent")
    _add_inflight(fd, +1)


def unpin(seg: _Segment) -> None:
    """The receiver of one in-flight handle has opened ``seg``: it no longer counts."""
    _add_inflight(seg._state["fd"], -1)


def list_segments(pid: int | None = None) -> list[str]:
    """Names of file_system segments in /dev/shm created by ``pid`` (all when None)."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return []
    out = []
    for n in names:
        parsed = _parse(n)
        if parsed is not None and (pid is None or parsed[0] == pid):
            out.append(n)
    return out


def _parse(name: str) -> tuple[int, int] | None:
    if not name.startswith(SEGMENT_PREFIX):
        return None
    parts = name[len(SEGMENT_PREFIX):].split("_")
    if len(parts) != 4 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return int(parts[0]), int(parts[1])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _try_reclaim(name: str, ignore_inflight: bool) -> bool:
    try:
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return _unlink_if_unused(fd, name, ignore_inflight)
    except OSError:
        return False
    finally:
        os.close(fd)


def reclaim(pids) -> int:
    """Unlink file_system segments created by the (dead) processes ``pids`` that no
    live process maps, in-flight handles included. Returns how many were unlinked.

    Called by a parent once children have exited (``ProcessContext.join``, exit).
    A segment a live process still maps is left to that process.
    """
    wanted = {int(p) for p in pids}
    count = 0
    for name in list_segments():
        creator, _ = _parse(name)
        if creator in wanted and not _pid_alive(creator):
            count += _try_reclaim(name, ignore_inflight=True)
    return count


def _exit_hook() -> None:
    """Release every segment this process still holds, then reclaim names that
    nothing holds any more: its own (in-flight ones too when it is a root
    process) and those of its dead children. Runs after multiprocessing has
    joined the children."""
    if _hook_pid != os.getpid():
        return
    import multiprocessing  # noqa: PLC0415 - at exit only: importing it up front costs every import of this module

    root = multiprocessing.parent_process() is None
    for fin in list(_live.values()):
        info = fin.detach()
        if info is not None:
            _release(*info[2], ignore_inflight=root)
    me = os.getpid()
    for name in list_segments():
        creator, parent = _parse(name)
        if creator == me:
            _try_reclaim(name, ignore_inflight=root)
        elif parent == me and not _pid_alive(creator):
            _try_reclaim(name, ignore_inflight=True)


def install_exit_hook() -> None:
    """Arrange for `_exit_hook` to run at exit of this process (idempotent, fork-aware)."""
    global _hook_pid
    if _hook_pid == os.getpid():
        return
    from multiprocessing import util  # noqa: PLC0415 - on first share only: importing it up front costs every import

    global _afterfork_registered
    if not _afterfork_registered:  # inherited by forked children, so once per process tree
        util.register_after_fork(sys.modules[__name__], _after_mp_fork)
        _afterfork_registered = True
    _hook_pid = os.getpid()
    # Negative priority: runs in util._exit_function after children are joined.
    util.Finalize(None, _exit_hook, exitpriority=-100)


def _after_fork_child() -> None:
    """A forked child inherits the parent's mappings and descriptors; the
    descriptors share the parent's open file description (and its flock), so
    give the child its own hold on each file_system segment."""
    global _lock, _hook_pid
    _lock = threading.RLock()
    _hook_pid = None
    for fin in list(_live.values()):
        info = fin.peek()
        if info is None:
            continue
        state, strategy, name = info[2]
        if state["fd"] >= 0 and strategy == "file_system":
            old = state["fd"]
            try:
                fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_CLOEXEC)
                fcntl.flock(fd, fcntl.LOCK_SH)
            except OSError:
                fd = -1  # already unlinked: the mapping stays valid, it just cannot be re-sent
            os.close(old)  # the parent's open file description (and lock) stay the parent's
            state["fd"] = fd
        state["pid"] = os.getpid()
    if _live:
        install_exit_hook()


def _after_mp_fork(_module) -> None:
    # multiprocessing clears inherited finalizers in a forked child, then runs
    # its after-fork hooks: register the exit hook again.
    global _hook_pid
    _hook_pid = None
    if _live:
        install_exit_hook()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_child)
