"""The files a job keeps in ``/dev/shm``: their names, and who removes them.

The socket backend's segments and rings are named
``ndist-<job>-<group>-r<rank>-p<pid>-...``: ``<job>`` is derived from the job
secret, so every process that knows the secret (a rank, its launcher,
``run_ranks``) can find the job's files, and ``<pid>`` is the owner, so a file
whose owner is gone can be told apart from one in use.

The backend's own files never stay in ``/dev/shm``: ``create_unlinked`` makes a
file and unlinks it in the next system call, keeping a descriptor; a peer of the
same host maps it through ``/proc/<owner pid>/fd`` (``open_shared``), and the
mappings keep the memory alive. The kernel frees it once the owner has closed
the descriptor (or died, even by SIGKILL) and the last mapping is gone, so no
file outlives the processes that use it, whatever kills them. The only window is
between those two system calls (a SIGKILL landing exactly there). A peer needs
the owner's ``/proc/<pid>/fd``: the same user and pid namespace (a same-host pair
in two pid namespaces does not share memory) and the owner's capabilities.

Where peers may not open the owner's descriptors as far as it can tell (not
dumpable, or permitted capabilities that are not effective), files keep their
names (``track``) until ``release``. Those, and files named by an older ndist, are
unlinked by their owner at release, at interpreter exit and on SIGTERM (a handler
installed only then, where SIGTERM has its default action), by every backend's
start for the job's files whose owner pid is dead (``sweep_dead``), and by the
launcher (``ndistrun``, ``run_ranks``) once the job's ranks are gone.

This module lives in the runtime so the launcher can use it without the
collectives layer; it imports only the standard library.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import glob
import hashlib
import mmap
import os
import re
import signal
import sys
import threading

__all__ = ["SHM_DIR", "job_prefix", "owner_pid", "unlink_prefix", "sweep_dead", "create_unlinked", "release",
           "map_owned", "open_shared", "held", "track", "untrack", "cleanup_now"]


SHM_DIR = "/dev/shm"
_PID = re.compile(r"-p(\d+)-")
_PR_GET_DUMPABLE = 3

#: path -> pid of the process that created it (a forked child must not unlink its parent's files)
_tracked: dict[str, int] = {}
#: job prefixes this process made files for (swept for dead owners at exit)
_jobs: set[str] = set()
_lock = threading.Lock()
_installed = False
_prctl = None


def job_prefix(secret: bytes | str, group_name: str | None = None) -> str:
    """``ndist-<job>-<group>`` (``ndist-<job>`` without a group); the job part is
    derived from the job secret."""
    if isinstance(secret, str):
        secret = secret.encode()
    job = f"ndist-{hashlib.sha256(b'ndist-job' + secret).hexdigest()[:10]}"
    if group_name is None:
        return job
    return f"{job}-{hashlib.sha256(group_name.encode()).hexdigest()[:8]}"


def owner_pid(name: str) -> int | None:
    """The owner pid in a file name of the job (``...-p<pid>-...``), or None."""
    m = _PID.search(os.path.basename(name))
    return int(m.group(1)) if m else None


def unlink_prefix(prefix: str) -> int:
    """Unlink every file in ``/dev/shm`` whose name starts with ``prefix``; how many."""
    n = 0
    for path in glob.glob(os.path.join(SHM_DIR, glob.escape(prefix) + "*")):
        try:
            os.unlink(path)
            n += 1
        except OSError:
            pass
    return n


def _caps() -> tuple:
    """This process's permitted and effective capability sets (``/proc/self/status``)."""
    prm = eff = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapPrm:"):
                prm = int(line.split()[1], 16)
            elif line.startswith("CapEff:"):
                eff = int(line.split()[1], 16)
    return prm, eff


def _peers_may_open() -> bool:
    """Whether a same-user peer may open this process's ``/proc/<pid>/fd`` (the kernel's
    ptrace read check): this process is dumpable (``PR_SET_DUMPABLE`` 0, or a set-uid
    start, forbids it), and its permitted capabilities are all effective: a peer started
    alike then holds them effective too (the kernel wants the owner's permitted set within
    the reader's effective one; a process that dropped an effective capability, e.g.
    ``CAP_SYS_PTRACE``, may not open a peer that still has it)."""
    global _prctl
    try:
        if _prctl is None:
            _prctl = ctypes.CDLL(None, use_errno=True).prctl
        if _prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) != 1:
            return False
        prm, eff = _caps()
    except (OSError, AttributeError, ValueError):  # pragma: no cover - no prctl or /proc: keep the names
        return False
    return prm & ~eff == 0


def create_unlinked(name: str, job: str | None = None) -> int:
    """A new file ``/dev/shm/<name>``, unlinked at once: its descriptor (the caller sizes,
    maps and, once no peer may still open it, gives it to ``release``). Peers reach it with
    ``open_shared(name, os.getpid())`` while the descriptor is open.

    Where peers may not open this process's descriptors (it is not dumpable), the file
    keeps its name until ``release`` (then it is ``track``-ed: unlinked at exit, on SIGTERM,
    and by the job's other processes once this one is dead; ``job``: swept at exit)."""
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    if _peers_may_open():
        os.unlink(path)  # (the next system call: a SIGKILL between the two is the only way it stays)
    else:
        track(path, job)
    return fd


def release(name: str, fd: int) -> None:
    """Stop sharing ``name`` (made by ``create_unlinked``): close ``fd`` and unlink the name
    where it still has one. Peers' mappings stay valid."""
    path = os.path.join(SHM_DIR, name)
    with _lock:
        named = _tracked.pop(path, None) is not None
    if named:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    try:
        os.close(fd)
    except OSError:  # pragma: no cover
        pass


def map_owned(fd: int, size: int) -> mmap.mmap:
    """``mmap.mmap(fd, size)`` for the owner of a ``create_unlinked`` file, keeping no other
    descriptor on the file: CPython's mmap keeps a duplicate of ``fd`` (for ``size()``),
    which would let peers open the file after the owner closed ``fd`` to stop sharing it.
    Python 3.13 has ``trackfd=False``; before, the duplicate is pointed at /dev/null."""
    if sys.version_info >= (3, 13):
        return mmap.mmap(fd, size, trackfd=False)
    mm = mmap.mmap(fd, size)
    st = os.fstat(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        for entry in os.listdir("/proc/self/fd"):
            other = int(entry)
            if other in (fd, null):
                continue
            try:
                o = os.fstat(other)
            except OSError:
                continue
            if (o.st_dev, o.st_ino) == (st.st_dev, st.st_ino):
                os.dup2(null, other, inheritable=False)  # (closed with the mmap, as before)
    finally:
        os.close(null)
    return mm


def open_shared(name: str, pid: int) -> int:
    """A read-write descriptor on ``/dev/shm/<name>`` made by process ``pid``: by its name
    while it has one (made by an older ndist), else the unlinked file ``pid`` holds open
    (``create_unlinked``), found through ``/proc/<pid>/fd``. ``FileNotFoundError`` when
    ``pid`` holds no such file (it closed it, or it exited); ``PermissionError`` when this
    process may not look into ``pid``'s descriptors."""
    path = os.path.join(SHM_DIR, name)
    try:
        return os.open(path, os.O_RDWR)
    except FileNotFoundError:
        pass
    want = path + " (deleted)"
    fds = f"/proc/{int(pid)}/fd"
    try:
        entries = os.listdir(fds)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, f"process {pid}, which made it, has exited", path) from None
    except PermissionError as err:
        raise PermissionError(errno.EACCES, f"cannot open process {pid}'s descriptors ({err.strerror}): ranks "
                              f"of one host need the same user, pid namespace and capabilities", path) from None
    denied = None
    for entry in entries:
        link = f"{fds}/{entry}"
        try:
            if os.readlink(link) != want:
                continue
            fd = os.open(link, os.O_RDWR)
        except PermissionError as err:
            denied = err
            continue
        except OSError:
            continue  # (closed meanwhile)
        try:  # the number may have been closed and reused between the look and the open
            if os.readlink(f"/proc/self/fd/{fd}") == want:
                return fd
        except OSError:
            pass
        os.close(fd)
    if denied is not None:
        raise PermissionError(errno.EACCES, f"cannot open process {pid}'s descriptors ({denied.strerror}): ranks "
                              f"of one host need the same user, pid namespace and capabilities", path)
    raise FileNotFoundError(errno.ENOENT, f"process {pid} holds no such file (it closed it)", path)


def held(prefix: str, pid: int | None = None) -> list:
    """Names of the unlinked ``/dev/shm`` files starting with ``prefix`` that process ``pid``
    (this one when None) holds open: what ``create_unlinked`` made and still shares."""
    fds = f"/proc/{os.getpid() if pid is None else int(pid)}/fd"
    start = os.path.join(SHM_DIR, prefix)
    out = set()
    try:
        entries = os.listdir(fds)
    except OSError:
        return []
    for entry in entries:
        try:
            link = os.readlink(f"{fds}/{entry}")
        except OSError:
            continue
        if link.startswith(start) and link.endswith(" (deleted)"):
            out.add(os.path.basename(link[: -len(" (deleted)")]))
    return sorted(out)


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return False


def sweep_dead(job: str) -> int:
    """Unlink the files of job ``job`` (a ``job_prefix(secret)``) whose owner process
    is gone: a rank killed before it or a peer could clean up, or an earlier attempt
    of a restarted job. Segments and rings alike."""
    n = 0
    for path in glob.glob(os.path.join(SHM_DIR, glob.escape(job) + "-*")):
        pid = owner_pid(path)
        if pid is None or not _dead(pid):
            continue
        try:
            os.unlink(path)
            n += 1
        except OSError:
            pass
    return n


def track(path: str, job: str | None = None) -> None:
    """``path`` was created by this process: unlink it at interpreter exit or on
    SIGTERM unless ``untrack`` came first; at exit also sweep ``job``'s dead owners."""
    with _lock:
        _tracked[path] = os.getpid()
        if job:
            _jobs.add(job)
    _install()


def untrack(path: str) -> None:
    with _lock:
        _tracked.pop(path, None)


def cleanup_now() -> None:
    """Unlink every tracked file of this process and sweep its jobs' dead owners."""
    me = os.getpid()
    with _lock:
        mine = [p for p, pid in _tracked.items() if pid == me]
        for p in mine:
            del _tracked[p]
        jobs = list(_jobs)
    for path in mine:
        try:
            os.unlink(path)
        except OSError:
            pass
    for job in jobs:
        try:
            sweep_dead(job)
        except OSError:  # pragma: no cover - /dev/shm vanished
            pass


def _on_sigterm(signum, frame) -> None:
    try:
        cleanup_now()
    finally:
        # die of the signal as if no handler had been installed (the exit status a
        # launcher reports stays "killed by SIGTERM")
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install() -> None:
    """Once per process: the atexit hook, and a SIGTERM handler where SIGTERM has its
    default action and this is the main thread (a program's own handler is left alone)."""
    global _installed
    if _installed:
        return
    _installed = True
    atexit.register(cleanup_now)
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):  # pragma: no cover - not the main interpreter
        pass
