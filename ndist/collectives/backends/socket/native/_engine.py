"""The native same-host engine, Python side: which engine runs, the shared files, the ops.

When every rank of a group is on this host (and none forced ``NDIST_TRANSPORT=tcp``),
the socket backend runs its collectives on the compiled engine (``_cnative``, source in
``native/cnative.c``): one call into C per collective, the GIL released while it
copies, reduces and waits. Each rank owns one file (``<shm prefix>-nat``: a control
block and two slots) that every peer maps; the C source describes the protocol. The
file is unlinked from ``/dev/shm`` as soon as it is made: peers map it through the
owner's descriptor (``_shmfiles.open_shared``), which the owner closes with the group.
A group that spans hosts (or runs over TCP by ``NDIST_TRANSPORT=tcp``) may run on the
same engine over its TCP streams instead (``TcpGroup``, source in ``native/ctcp.c``):
every rank offers it as ``NDIST_NATIVE_TCP`` says (``tcp_offer``), and a group of up to
``TCP_MAX_RANKS`` runs it when every rank offers it (``_engines.select``); the group's collective
links, dialled and authenticated by the mesh, are handed to C (``attach_tcp``).
Point-to-point traffic, and every other group, stay on the Python engine
(``_engine.py``), which is also the reference the conformance suite holds the native
engine to.

``NDIST_ENGINE=python|auto|native`` (every rank alike) picks the engine: ``auto`` (the
default: native where it can run; without the extension, one warning at first use saying
what to install, then the Python engine), ``python`` (the Python engine everywhere) or
``native`` (as ``auto``, but a missing extension is an error). ``dist.get_engine(group)`` tells which
engine a group's CPU collectives run on.
"""

from __future__ import annotations

import logging
import mmap
import os
import weakref

import numpy as np

from .....runtime import DistBackendError, DistMismatchError, DistNetworkError, DistTimeoutError
from .....runtime import _shmfiles
from ..wire import _frame as F
from ..schedules._reduce import ERRVAR, IGNORE_ERRORS, UFUNC, finalize
from ..wire._segment import SHM_DIR, job_of

__all__ = ["ENGINE_ENV", "SLOT_ENV", "CMA_ENV", "TCP_ENV", "cma_min_bytes", "tcp_cma_min_bytes", "engine_mode", "module_for",
           "extension", "tcp_offer", "TCP_MAX_RANKS", "slot_bytes", "spins", "NativeFile", "NativeAlgorithms", "attach", "attach_tcp", "tcp_spins"]

log = logging.getLogger("ndist.collectives.socket")

ENGINE_ENV = "NDIST_ENGINE"
#: the engine when NDIST_ENGINE is unset (see the module docstring)
DEFAULT = "auto"
SLOT_ENV = "NDIST_NATIVE_SLOT"
#: the native engine over TCP: ``auto`` (the default: for a group that spans hosts), ``1`` (also
#: for a group on one host whose streams are TCP, ``NDIST_TRANSPORT=tcp``: how the suites run it
#: on one host) or ``0`` (never: such groups run on the Python engine)
TCP_ENV = "NDIST_NATIVE_TCP"
#: the most ranks a group runs on the native engine over TCP: its algorithms are direct (every
#: rank sends to every peer in a phase); a larger group runs the Python engine's log-depth
#: schedules (docs/native.md, "Across hosts")
TCP_MAX_RANKS = 8
SPIN_ENV = "NDIST_NATIVE_SPIN_US"
CMA_ENV = "NDIST_NATIVE_CMA_MIN"
#: all_to_all blocks, all_gather parts and broadcast buffers of at least this many bytes go
#: with one copy (``process_vm_readv``) to peers that may read this rank's memory; the rest
#: through the slots (two copies). 16 KiB: plain loops at 2 ranks (docs/performance.md in git
#: history, "Single copy from 16 KiB, 256 KiB slots", 2026-11-24) took all_to_all of 32-256 KiB from 5.1-19.8 to 4.1-9.9 us and
#: all_gather of 32-256 KiB from 4.9-19.7 to 3.8-9.7 us against 256 KiB before; at 8 KiB
#: blocks it was even, at 4 ranks on 2 cores 0.7-1.1x.
CMA_MIN = 16 << 10
#: A broadcast goes by address (each receiver reads the root's buffer, the root waits for
#: them: not eager) where it measured faster on 2 cores: with one receiver from ``CMA_MIN``
#: up to one slot (256 KiB: 10.5 us against 17; beyond a slot the slots' pieces pipeline on
#: both cores, 4 MiB 312 us against 353-427); with 2 receivers or more, no more than the
#: cores, from ``BCAST_MANY_MIN`` (3 ranks: 16-64 KiB 1.1-1.3x slower by address, 1 MiB
#: 0.74-1.1x, 4-64 MiB 0.51-0.91x); with more receivers than cores never (4 and 8 ranks on 2
#: cores: even or slower). An all_gather's parts (every rank reads every peer's) go by
#: address where the ranks are no more than the cores (4 ranks on 2 cores: 0.92-1.1x).
BCAST_MANY_MIN = 1 << 20
#: the TCP engine's payloads to a peer on this host (a Unix socket) go by address from this
#: many bytes when ``NDIST_NATIVE_CMA_MIN`` is unset (set, it applies to both engines): each
#: costs a DONE frame back before the sender's phase ends, which at 2 hosts x 2 ranks made
#: 64 KiB reduce_scatter and all_reduce 1.5x slower from 16 KiB, while from 1 MiB the one copy
#: gained (reduce_scatter 16 MiB 0.87x, all_to_all 0.90x; docs/perf/s20_mh_2x2_cubic_*.txt);
#: the Python engine's all_to_all takes the same path from 512 KiB (engine/_algorithms.py)
TCP_CMA_MIN = 512 << 10
#: data bytes per slot (a piece): 256 KiB pipelines the large reductions more finely than the
#: 1 MiB of before (2 ranks, reduce_scatter 1-16 MiB 0.70-0.79x the time, all_reduce 4-16 MiB
#: 0.85-0.93x; broadcast 4-16 MiB 1.04-1.08x, the other ops even; docs/performance.md in git
#: history, "Single copy from 16 KiB, 256 KiB slots", 2026-11-24)
SLOT = 256 << 10
#: all_reduce above this many bytes: reduce-scatter + all-gather through the slots
RSAG_MIN = 256 << 10
#: how long a waiting rank spins before it sleeps (when every rank has a core): 200 µs halved
#: a 4 KiB all_to_all at n=2 against 20 (docs/performance.md in git history, "Spinning before sleeping", 2026-11-23)
SPIN_US = 200.0
#: the spin (a ``sched_yield`` after every 64 looks) also when ranks outnumber cores, up to
#: this many ranks per core: at 4 and 8 ranks on 2 cores it took broadcast 4 KiB from
#: 1.4-3.6x MPICH's time to 1.5 and 1.6x, all_gather and all_reduce 4 KiB below 0.65x
#: (docs/performance.md in git history, "Spinning when ranks outnumber cores", 2026-11-24). Beyond it (64 or 128 ranks
#: on a few cores) a waiter sleeps after a few yields, as before.
SPIN_RANKS_PER_CORE = 4


def spins(n: int) -> bool:
    """Whether the waiters of a same-host group of ``n`` ranks spin before they sleep
    (``SPIN_RANKS_PER_CORE``)."""
    return n <= SPIN_RANKS_PER_CORE * (os.cpu_count() or 1)

_CTL = 4096
_HDR = 64

# op codes of the C engine, for messages
_OPS = {1: "all_reduce", 2: "reduce", 3: "broadcast", 4: "all_gather", 5: "gather", 6: "scatter",
        7: "all_to_all", 8: "reduce_scatter", 9: "barrier"}

_state = {"tried": False, "mod": None, "error": None, "warned": False}
#: a wait for a peer's ``done`` word: it has not finished reading this rank's earlier piece
_DONE_NOTE = " (still reading this rank's earlier data)"


def _elements(dtype: int, nbytes: int, esize: int) -> int:
    """A header's element count: ``nbytes`` over its element size (``esize``, else the
    dtype code's itemsize, else 1), for messages."""
    if not esize:
        try:
            esize = np.dtype(F.dtype_name(dtype)).itemsize
        except TypeError:
            esize = 1
    return nbytes // max(esize, 1)


def engine_mode(options=None) -> str:
    """``auto`` / ``native`` / ``python``: the backend option ``socket_engine``, else ``NDIST_ENGINE``."""
    mode = getattr(options, "socket_engine", None) or os.environ.get(ENGINE_ENV, DEFAULT)
    mode = str(mode).strip().lower() or DEFAULT
    if mode not in ("auto", "native", "python"):
        raise ValueError(f"{ENGINE_ENV}: expected 'auto', 'native' or 'python', got {mode!r}")
    return mode


def _load():
    if not _state["tried"]:
        _state["tried"] = True
        try:
            from . import _cnative
        except ImportError as err:
            _state["error"] = err
        else:
            _state["mod"] = _cnative
    return _state["mod"]


def module_for(transport: str, options=None):
    """The extension module if this backend runs the native engine, else None."""
    mode = engine_mode(options)
    if mode == "python" or transport == "tcp" or not os.path.isdir(SHM_DIR):
        return None
    mod = _load()
    if mod is None:
        hint = ("install a C compiler and the Python headers (e.g. `apt install gcc python3-dev`) and "
                "reinstall ndist (`pip install -e .` or `pip install ndist`)")
        if mode == "native":
            raise RuntimeError(f"{ENGINE_ENV}=native: ndist's native engine is not built ({_state['error']}); "
                               f"{hint}, or set {ENGINE_ENV}=python")
        if not _state["warned"]:
            _state["warned"] = True
            log.warning("ndist's native engine is not built (%s); collectives run on the Python engine. "
                        "For the native engine, %s.", _state["error"], hint)
    return mod


def extension():
    """The compiled module (``_cnative``), or None where it was not built."""
    return _load()


def lane_state(options=None):
    """An executor's busy flag and sequence number (``_executor.py``): the compiled
    ``LaneState``, which the repeated call in C (``FastLane``) takes too, or None (the
    executor's Python one) with ``NDIST_ENGINE=python`` or where nothing was built."""
    if engine_mode(options) == "python":
        return None
    mod = _load()
    return mod.LaneState() if mod is not None else None


def recorder_types(options=None):
    """The flight recorder's ring and counter types in C (``_cnative.Ring``, ``Counter``:
    crecord.c), which the repeated call in C writes without a Python object; None with
    ``NDIST_ENGINE=python`` or where nothing was built (``_debug``'s deque and
    ``itertools.count`` stay)."""
    if engine_mode(options) == "python":
        return None
    mod = _load()
    return (mod.Ring, mod.Counter) if mod is not None else None


def tcp_offer(options=None) -> str:
    """What this rank offers its groups of the native engine over TCP: ``""`` (nothing:
    ``NDIST_NATIVE_TCP=0``, ``NDIST_ENGINE=python``, or the extension not built), ``"auto"``
    (groups that span hosts) or ``"always"`` (also one host's groups over TCP)."""
    raw = os.environ.get(TCP_ENV, "auto").strip().lower() or "auto"
    if raw not in ("0", "1", "auto"):
        raise ValueError(f"{TCP_ENV}: expected 'auto', '0' or '1', got {raw!r}")
    if raw == "0" or engine_mode(options) == "python" or _load() is None:
        return ""
    return "always" if raw == "1" else "auto"


def tcp_spins(sharing: int) -> bool:
    """Whether the waiters of a group over TCP spin before they sleep: when the group's ranks
    that run on this machine (``sharing``, this one included; namespaces of one machine count
    as one) have a CPU each. Ranks on other machines take none of this one's CPUs."""
    return sharing <= (os.cpu_count() or 1)


def attach_tcp(mod, socks: dict, rank: int, size: int, timeout: float, sharing: int | None = None,
               facts: dict | None = None):
    """The C group over the collective links ``socks`` (group rank -> connected socket); it
    takes their descriptors (closing them with itself), the socket objects are detached.
    ``sharing``: the group's ranks on this machine (``tcp_spins``; None: all of them).
    ``facts``: each link's ``wire._link_facts.Facts`` (group rank -> facts): a payload of at
    least ``tcp_cma_min_bytes()`` to a peer on this host that reads this rank's memory goes by
    address (ctcp.c, single copy), as the same-host engine's blocks do."""
    cma_min = tcp_cma_min_bytes()  # (a bad setting raises before the group owns the descriptors)
    fds = [-1] * size
    for p, sock in socks.items():
        fds[p] = sock.detach()
    cma = [None] * size
    for p, f in (facts or {}).items():
        if f is not None and (f.read_pid or f.they_read):
            cma[p] = (int(f.read_pid or 0), bool(f.they_read))
    try:
        spin = tcp_spins(size if sharing is None else sharing)
        group = mod.TcpGroup(rank, size, fds, timeout, float(os.environ.get(SPIN_ENV, SPIN_US if spin else 0.0)),
                             cma)
        group.cma_min = cma_min
        return group
    except BaseException:
        for fd in fds:
            if fd >= 0:
                os.close(fd)
        raise


def slot_bytes() -> int:
    """Data bytes per slot: ``NDIST_NATIVE_SLOT``, else ``SLOT`` at every group size; each
    rank's file holds two slots."""
    raw = os.environ.get(SLOT_ENV, "").strip()
    if raw:
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"{SLOT_ENV}: expected a byte count, got {raw!r}") from None
        if value < 4096 or value % 64:
            raise ValueError(f"{SLOT_ENV}: expected a multiple of 64 of at least 4096 bytes, got {value}")
        return value
    return SLOT


def env_bytes(var: str, default: int, zero: str) -> int:
    """A byte count >= 0 from environment variable ``var`` (unset or empty: ``default``);
    ``zero`` says what 0 means, for the ``ValueError`` a bad value raises."""
    raw = os.environ.get(var, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{var}: expected a byte count (0: {zero}), got {raw!r}") from None
    if value < 0:
        raise ValueError(f"{var}: expected a byte count >= 0 (0: {zero}), got {value}")
    return value


def cma_min_bytes() -> int:
    """``NDIST_NATIVE_CMA_MIN`` (bytes; 0 turns the single-copy path off), else ``CMA_MIN``."""
    return env_bytes(CMA_ENV, CMA_MIN, "off")


def tcp_cma_min_bytes() -> int:
    """The TCP engine's: ``NDIST_NATIVE_CMA_MIN`` (bytes; 0 turns it off), else ``TCP_CMA_MIN``."""
    return env_bytes(CMA_ENV, TCP_CMA_MIN, "off")


def _file_bytes(size: int, slot: int) -> int:
    data_off = (_HDR + 8 * size + 63) // 64 * 64
    stride = (data_off + slot + 4095) // 4096 * 4096
    return _CTL + 2 * stride


def _unlink(name: str, fd: int) -> None:
    """Stop sharing: close the descriptor peers map the file through (``_shmfiles.release``)."""
    _shmfiles.release(name, fd)


class NativeFile:
    """This rank's control block and slots in ``/dev/shm``, mapped read-write."""

    def __init__(self, prefix: str, size: int, slot: int) -> None:
        self.slot = slot
        self.path = os.path.join(SHM_DIR, prefix + "-nat")
        nbytes = _file_bytes(size, slot)
        name = prefix + "-nat"
        fd = _shmfiles.create_unlinked(name, job_of(prefix))
        try:
            os.posix_fallocate(fd, 0, nbytes)  # a full /dev/shm fails here, not with SIGBUS later
            self.mm = _shmfiles.map_owned(fd, nbytes)
        except BaseException:
            _unlink(name, fd)
            raise
        self._finalizer = weakref.finalize(self, _unlink, name, fd)  # (kept open while peers may map it)

    def unlink(self) -> None:
        self._finalizer()


class PeerFileGone(Exception):
    """``attach``: group rank ``args[0]``'s file is gone: it closed the group, or died."""


def attach(mod, own: NativeFile, prefixes: dict, pids: dict, rank: int, size: int, timeout: float, spin: bool):
    """The C group over every rank's file (peers' mapped here; they live while mapped)."""
    maps = []
    nbytes = _file_bytes(size, own.slot)
    for r in range(size):
        if r == rank:
            maps.append(own.mm)
            continue
        try:
            fd = _shmfiles.open_shared(prefixes[r] + "-nat", int(pids[r]))
        except FileNotFoundError:
            raise PeerFileGone(r) from None  # it closed the group (or died) before this rank came
        except PermissionError as err:
            raise DistBackendError(f"cannot map group rank {r}'s native engine file: {err}") from None
        try:
            maps.append(mmap.mmap(fd, nbytes))
        finally:
            os.close(fd)
    pid_list = [os.getpid() if r == rank else int(pids[r]) for r in range(size)]
    spin_us = float(os.environ.get(SPIN_ENV, SPIN_US if spin else 0.0))  # (set: for any group size)
    group = mod.Group(rank, size, maps, own.slot, pid_list, timeout, spin_us)
    group.cma_min = cma_min_bytes()  # before the set-up barrier, which probes the peers
    cores, cma = os.cpu_count() or 1, group.cma_min
    if cma and size == 2:  # one receiver: by address while the buffer fits one slot
        group.bcast_min, group.bcast_max = cma, own.slot
    elif cma and size - 1 <= cores:
        group.bcast_min = max(cma, BCAST_MANY_MIN)
    group.gather_min = cma if size <= cores else 0
    return group


def _u8(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


def _fallback(op, dtype):
    """NumPy's ufunc for a (dtype, op) without a C kernel (float8, longdouble, ...)."""
    f = UFUNC[op]

    def reduce(d, a, b):
        out = np.frombuffer(d, dtype)
        token = ERRVAR.set(IGNORE_ERRORS) if ERRVAR is not None else None
        try:
            f(np.frombuffer(a, dtype), np.frombuffer(b, dtype), out=out)
        finally:
            if token is not None:
                ERRVAR.reset(token)
    return reduce


def _weakly(method):
    """``method``, called through a weak reference to its object: the C group holds its
    callbacks and is not tracked by the garbage collector, so a bound method of the object
    that holds the group would make a cycle never collected, keeping the backend (and the
    store it was given: torch's ``file://`` store file) alive until the process ends."""
    ref = weakref.WeakMethod(method)

    def call(*args):
        bound = ref()
        if bound is not None:
            bound(*args)

    return call


class NativeAlgorithms:
    """The socket backend's collectives on the native engine (the methods of ``Algorithms``)."""

    def __init__(self, mod, group, rank: int, size: int, group_name: str = "", warn_after: float = 0.0,
                 granks=None, lane_state=None) -> None:
        self.mod = mod
        self.g = group  # holds buffer exports of every rank's mapping: they live as long as it
        self.rank = rank
        self.size = size
        #: global rank of each group rank: messages and ``.rank`` name them (the C engine counts group ranks)
        self.granks = tuple(range(size)) if granks is None else tuple(granks)
        self.group_name = group_name
        self._red: dict = {}
        self._codes: dict = {}  # dtype -> the C engine's dtype code
        #: the executor's state (``_cnative.LaneState``), whose ``broken`` flag mirrors ``broken``
        #: for the C core's claim (native/clane.c), or None
        self.lane_state = lane_state
        self._broken: BaseException | None = None
        #: the running op (name, dtype code, count, seq, root, reduce op) of the Python paths, set
        #: by the backend per op (``desc``)
        self.op = None
        #: the group's ``_cnative.FastLane``s (``native/_fast.py``): each describes the last op it
        #: ran (``current()``, the same tuple), which ``desc`` names when it is the newer
        self.lanes: list = []
        group.warn_after = warn_after
        group.on_stall = _weakly(self._on_stall) if warn_after > 0 else None
        #: ``on_stalled(global ranks)``: an op passed its deadline (the backend's ``_stalled``:
        #: the process's other groups tell their peers; ``_stalls``)
        self.on_stalled = None
        if hasattr(group, "on_deadline"):  # (the same-host group's first notice; TcpGroup has none)
            group.on_deadline = _weakly(self._on_deadline)

    def _redinfo(self, dtype, op):
        key = (dtype, op._value_)  # (a ReduceOp's own hash is Python code: its value's is not)
        info = self._red.get(key)
        if info is None:
            code, rc = F.dtype_code(dtype), F.redop_code(op)
            fb = None if code and self.mod.supports(code, rc) else _fallback(op, dtype)
            info = self._red[key] = (code, rc, np.dtype(dtype).itemsize, fb)
        return info

    # ---------------------------------------------------------- reductions
    def all_reduce(self, buf, op, scale) -> None:
        code, rc, es, fb = self._redinfo(buf.dtype, op)
        self.g.all_reduce(buf, code, rc, es, fb, buf.nbytes > RSAG_MIN)
        if rc == 5 or rc == 9:  # AVG, PREMUL_SUM
            finalize(buf, op, scale, self.size)

    def direct_reduce(self, buf, op, scale, root) -> None:
        code, rc, es, fb = self._redinfo(buf.dtype, op)
        self.g.reduce(buf, code, rc, es, fb, root)
        if self.rank == root and (rc == 5 or rc == 9):
            finalize(buf, op, scale, self.size)

    def reduce_scatter(self, out, inputs, op, scale) -> None:
        code, rc, es, fb = self._redinfo(out.dtype, op)
        self.g.reduce_scatter(out, inputs, code, rc, es, fb)
        if rc == 5 or rc == 9:
            finalize(out, op, scale, self.size)

    # ---------------------------------------------------------- the thin lane
    # A blocking op the backend runs on the caller's thread (``SocketBackend._inline``):
    # numbered ``seq`` and described (``op``) as ``_submit``'s job does, then one call into C.
    # A list of per-rank buffers may be one buffer instead: n equal parts of it (C cuts it).
    # Each takes four arguments after ``seq`` (unused ones ``None``): the backend's
    # ``_inline`` calls them alike.
    def lane_all_reduce(self, seq: int, buf, op, scale, _=None) -> None:
        code, rc, es, fb = self._red.get((buf.dtype, op._value_)) or self._redinfo(buf.dtype, op)
        g = self.g
        g.seq = seq
        self.op = ("all_reduce", code, buf.size, seq, -1, op)
        g.all_reduce(buf, code, rc, es, fb, buf.nbytes > RSAG_MIN)
        if rc == 5 or rc == 9:  # AVG, PREMUL_SUM
            finalize(buf, op, scale, self.size)

    def lane_reduce_scatter(self, seq: int, out, inputs, op, scale) -> None:
        code, rc, es, fb = self._red.get((out.dtype, op._value_)) or self._redinfo(out.dtype, op)
        g = self.g
        g.seq = seq
        self.op = ("reduce_scatter", code, out.size, seq, -1, op)
        g.reduce_scatter(out, inputs, code, rc, es, fb)
        if rc == 5 or rc == 9:
            finalize(out, op, scale, self.size)

    def lane_broadcast(self, seq: int, buf, src, _=None, __=None) -> None:
        code = self._code(buf.dtype)
        g = self.g
        g.seq = seq
        self.op = ("broadcast", code, buf.size, seq, src, None)
        g.broadcast(buf, code, src)

    def lane_all_gather(self, seq: int, outputs, inp, _=None, __=None) -> None:
        code = self._code(inp.dtype)
        g = self.g
        g.seq = seq
        self.op = ("all_gather", code, inp.size, seq, -1, None)
        g.all_gather(outputs, inp, code)

    def lane_all_to_all(self, seq: int, outputs, inputs, inp, counts=None) -> None:
        """``counts``: None, or (out counts, in counts) in elements: ``outputs`` and ``inputs``
        are then one buffer each, cut at them in C (the uneven single-buffer form)."""
        code = self._code(inp.dtype)
        g = self.g
        g.seq = seq
        self.op = ("all_to_all", code, inp.size, seq, -1, None)
        if counts is None:
            g.all_to_all(outputs, inputs, code)
        else:
            g.all_to_all(outputs, inputs, code, counts[0], counts[1], inp.itemsize)

    def lane_barrier(self, seq: int, _=None, __=None, ___=None, ____=None) -> None:
        g = self.g
        g.seq = seq
        self.op = ("barrier", 0, 0, seq, -1, None)
        g.barrier()

    def _code(self, dtype) -> int:
        code = self._codes.get(dtype)
        if code is None:
            code = self._codes[dtype] = F.dtype_code(dtype)
        return code

    # ---------------------------------------------------------- movement
    def broadcast(self, buf, src) -> None:
        self.g.broadcast(buf, F.dtype_code(buf.dtype), src)

    def all_gather(self, outputs, inp) -> None:
        self.g.all_gather(outputs, inp, F.dtype_code(inp.dtype))

    def gather(self, outputs, inp, dst) -> None:
        self.g.gather(outputs if self.rank == dst else None, inp, F.dtype_code(inp.dtype), dst)

    def scatter(self, out, inputs, src) -> None:
        self.g.scatter(out, inputs if self.rank == src else None, F.dtype_code(out.dtype), src)

    def all_to_all(self, outputs, inputs, even: bool = False) -> None:  # (even: the slots need no hint)
        self.g.all_to_all(outputs, inputs, F.dtype_code(inputs[0].dtype))

    def barrier(self) -> None:
        self.g.barrier()

    @property
    def broken(self) -> BaseException | None:
        """The first failure that broke the group: every later op raises it (as the Python
        engine's). Set, never cleared; the C core's claim reads its flag in ``lane_state``."""
        return self._broken

    @broken.setter
    def broken(self, exc: BaseException | None) -> None:
        self._broken = exc  # (before the flag: a claim that sees the flag finds the error here)
        if self.lane_state is not None:
            self.lane_state.broken = exc is not None

    def desc(self) -> str:
        """The running op as the Python engine names it (``rank 0: all_reduce float64[4] SUM #2``)."""
        op = self.op
        for lane in self.lanes:  # an op the C core ran, when it is the newer (every path's number
            cur = lane.current()  # comes from the one executor, in the order the ops start)
            if cur is not None and (op is None or cur[3] > op[3]):
                op = cur
        if op is None:
            return "no collective running"
        name, dcode, count, seq, root, redop = op
        g = self.granks  # messages name global ranks
        return F.describe(g[self.rank], F.op_code(name), dcode, count, seq, g[root] if root >= 0 else root,
                          F.redop_code(redop))

    def pending(self) -> str:
        """For a timeout's message: the ranks that have not posted this rank's current piece,
        or have not finished reading the piece before (what a waiting rank waits for)."""
        if hasattr(self.g, "waiting"):  # TcpGroup: the ranks its phase still sends to or reads from
            late = [self.granks[q] for q in self.g.waiting()]
            return f"running {self.desc()} (native engine over TCP); ranks not heard from: {late}"
        piece, words = self.g.progress()
        late = [self.granks[q] for q, (post, done, _state) in enumerate(words)
                if q != self.rank and (post < 2 * piece or done + 2 < piece)]
        return f"running {self.desc()} (native engine, piece {piece}); ranks not heard from: {late}"

    def _on_stall(self, peer: int, word: int, waited: float, left: float) -> None:
        """Called from the wait in C (with the GIL) after ``NDIST_WAIT_WARNING`` seconds, then
        once a minute: the Python engine's warning, word for word."""
        log.warning("group %r: %s has waited %.0f s; ranks not heard from: [%d]%s (it fails at the group "
                    "timeout, in %.0f s)", self.group_name, self.desc(), waited, self.granks[peer],
                    _DONE_NOTE if word else "", max(0.0, left))

    def _on_deadline(self, code: int) -> None:
        """Called from the wait in C (with the GIL) when an op's deadline passes, and when its
        first notice is refined in the grace, naming ``code`` (a group rank, or
        ``STALL_GLOBAL`` + a global rank): the process's other groups tell their peers."""
        if self.on_stalled is not None:
            rank = self._global(code)
            if rank is not None:
                self.on_stalled([rank])

    def _describe(self, sig) -> str:
        """An earlier call of this rank from its header fields (op, dtype, root, nbytes, seq, esize)."""
        op, dtype, root, nbytes, seq, esize = sig
        name = _OPS.get(op, f"op#{op}")
        g = self.granks
        return F.describe(g[self.rank], F.op_code(name), dtype, _elements(dtype, nbytes, esize), seq,
                          g[root] if 0 <= root < len(g) else root)

    def _global(self, code):
        """The global rank a notice or a cause ``code`` of the C engine names, or None."""
        if not isinstance(code, int) or code < 0:
            return None
        if code >= self.mod.STALL_GLOBAL:
            return code - self.mod.STALL_GLOBAL
        return self.granks[code] if code < self.size else None

    def tell_stalled(self, ranks, final: bool = False) -> None:
        """Idle here, this process passed a deadline elsewhere waiting on global ``ranks``
        (``final``: it raised naming them): post the notice words (a peer whose deadline
        passes waiting on this rank names the first of them; cleared at this rank's next op)."""
        r = min(ranks)
        code = self.granks.index(r) if r in self.granks else self.mod.STALL_GLOBAL + r
        self.g.tell_stalled(code | self.mod.STALL_FINAL if final else code)

    def mark_lost(self, exc: BaseException) -> None:
        """The backend learnt of a member's loss outside this engine (point-to-point): the
        group is broken; this rank's state turns failed naming ``exc.rank``, so every
        same-host rank waiting in C (here or on this rank) wakes within ~20 ms and raises
        naming it, and every later op raises ``exc``."""
        if self.broken is None:
            self.broken = exc
        cause = getattr(exc, "rank", None)  # a global rank; the C engine counts group ranks
        if cause in self.granks:
            self.g.fail(self.granks.index(cause))
        elif isinstance(cause, int) and cause >= 0:  # not a member (ProcessGroup.revoke_for): by global rank,
            self.g.fail(self.mod.STALL_GLOBAL + cause)  # so a peer names it, not this rank
        else:
            self.g.fail(-1)

    # ---------------------------------------------------------- failures
    def error(self, err, group_name: str, desc: str, hosts: dict, timeout: float) -> Exception:
        """The typed error of a ``_cnative.Error(kind, peer, cause, detail)`` raised in ``desc``."""
        kind, peer, cause, detail = err.args
        host, chost = hosts.get(peer, "?"), hosts.get(cause, "?")
        gr = self.granks  # the C engine names group ranks; messages and .rank name global ones
        prior = detail[-1]  # found settling the broadcast this rank (its root) returned from before ``desc``
        if prior is not None and kind != "mismatch":
            desc = f"{self._describe(prior)} (its root returned; found at {desc})"
        peer = gr[peer] if isinstance(peer, int) and 0 <= peer < len(gr) else peer
        named = self._global(cause)  # (STALL_GLOBAL + r: a rank the peer waited on in another group)
        if named is not None and named != cause and named in gr:  # (a member named by its global rank)
            chost = hosts.get(gr.index(named), chost)
        cause = cause if named is None else named
        g = f"group {group_name!r}"
        if kind == "stalled" and self.on_stalled is not None and isinstance(cause, int):
            # the root cause reaches the process's other groups too (a chain across groups)
            self.on_stalled([cause], final=True)
        if kind == "timeout" and self.on_stalled is not None and isinstance(peer, int):
            self.on_stalled([peer], final=True)
        if kind == "timeout":  # the Python engine's words (docs/errors.md)
            return DistTimeoutError(f"{g}: {desc} timed out; ranks not heard from: [{peer}]"
                                    f"{_DONE_NOTE if detail[0] else ''}")
        if kind == "stalled" and cause == gr[self.rank]:  # it waits on this rank: a deadlock, not a stall
            return DistTimeoutError(f"{g}: {desc} timed out; ranks not heard from: [{peer}]")
        if kind == "stalled":  # the peer waited on timed out waiting on ``cause`` (a stopped rank, say)
            return DistTimeoutError(f"{g}: {desc} timed out; ranks not heard from: [{cause}] (rank {peer} ({host}) "
                                    f"waited on it)")
        if kind == "dead":
            return DistNetworkError(f"{g}: lost connection to rank {peer} ({host}) during {desc}: its process "
                                    f"exited", rank=peer, host=host)
        if kind == "abort":  # (TcpGroup) the mesh's lost notice: the peer could not build or keep the group
            why = F.unpack_abort(detail[0])
            lost, lhost = why.get("rank"), why.get("host") or "?"
            if not isinstance(lost, int) or lost < 0:
                return DistNetworkError(f"{g}: rank {peer} ({host}) abandoned the group during {desc}: "
                                        f"{why.get('msg')}", rank=peer, host=host)
            if why.get("kind") == "stalled":
                return DistTimeoutError(f"{g}: {desc} timed out; ranks not heard from: [{lost}] (rank {peer} "
                                        f"({host}) waited on it)")
            return DistNetworkError(f"{g}: rank {lost} ({lhost}) is lost, during {desc}; rank {peer} ({host}) "
                                    f"reported: {why.get('msg')}", rank=lost, host=lhost)
        if kind == "lost":  # (TcpGroup) its stream ended, or failed, without its close notice
            return DistNetworkError(f"{g}: lost connection to rank {peer} ({host}) during {desc}: the connection "
                                    f"ended", rank=peer, host=host)
        if kind == "failed":
            if cause == peer:
                return DistNetworkError(f"{g}: rank {peer} ({host}) failed during {desc}", rank=peer, host=host)
            return DistNetworkError(f"{g}: rank {cause} ({chost}) is lost, during {desc}; rank {peer} ({host}) "
                                    f"reported it", rank=cause, host=chost)
        if kind == "closed":
            return DistNetworkError(f"{g}: rank {peer} ({host}) closed the group (destroy_process_group or exit) "
                                    f"during {desc}", rank=peer, host=host)
        if kind == "self_failed":  # mark_lost: the backend learnt of a loss elsewhere
            lost = self.broken
            chost = hosts.get(cause, "?")
            if isinstance(lost, DistNetworkError) and lost.rank == cause:
                chost = lost.host or chost
                msg = str(lost)
                msg = msg.split(": ", 1)[1] if msg.startswith("group ") else msg
                return DistNetworkError(f"{g}: rank {cause} ({chost}) is lost, during {desc}; {msg}", rank=cause,
                                        host=chost)
            return DistNetworkError(f"{g}: rank {cause} ({chost}) is lost, during {desc}", rank=cause, host=chost)
        if kind == "self_closed":
            return DistNetworkError(f"{g}: backend closed during {desc}", rank=peer, host=host)
        if kind == "mismatch":
            op, dtype, redop, root, nbytes, seq, esize, sends, wants, _ = detail
            if prior is not None:  # (a broadcast's root compares whole calls: no per-peer sizes)
                ours = self._describe(prior)
            name = _OPS.get(op, f"op#{op}")
            theirs = F.describe(peer, F.op_code(name), dtype, _elements(dtype, nbytes, esize), seq,
                                root if name in ("reduce", "broadcast", "gather", "scatter") else -1, redop)
            if prior is not None:
                return DistMismatchError(f"collective mismatch in group {group_name!r}: {ours}; {theirs} (rank "
                                         f"{gr[self.rank]} had returned from its broadcast; found at {desc})")
            if sends >= 0:
                return DistMismatchError(f"collective mismatch in group {group_name!r}: {desc} expects {wants} "
                                         f"bytes from rank {peer}; {theirs} sends {sends} bytes")
            return DistMismatchError(f"collective mismatch in group {group_name!r}: {desc}; {theirs}")
        return DistNetworkError(f"{g}: {desc}: native engine error {kind} (rank {peer})", rank=peer, host=host)
