"""The implementation of ``ndist.cuda`` on CuPy, plus the device plumbing tensors use.

CuPy is imported on first use only. Without CuPy, or without a GPU, every
request for CUDA raises ``RuntimeError`` saying which of the two is missing; an
ordinal past the last GPU is a ``ValueError`` naming the ordinal and the count.
Nothing here ever falls back to the CPU silently.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Any

from ._device import CPU, device as _device_t, to_device

__all__ = [
    "is_available",
    "device_count",
    "current_device",
    "set_device",
    "device",
    "device_of",
    "get_device_name",
    "get_device_capability",
    "get_device_properties",
    "synchronize",
    "Stream",
    "Event",
    "current_stream",
    "default_stream",
    "stream",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "empty_cache",
    "mem_get_info",
]

_log = logging.getLogger("ndist.tensor")
_count_cache: list[int] = []  # device count, cached once a GPU was seen (like torch)


_import_failed: list[str] = []  # why ``import cupy`` failed, remembered (it is not retried)


def cupy_or_none():
    """The cupy module if it is importable, else None (no exception)."""
    mod = sys.modules.get("cupy")
    if mod is not None:
        return mod
    if _import_failed:
        return None
    try:
        import cupy  # noqa: PLC0415 - lazy on purpose
    except Exception as exc:  # ImportError, or a broken CUDA install
        _log.debug("cupy not importable: %s", exc)
        missing = isinstance(exc, ModuleNotFoundError) and exc.name == "cupy"
        _import_failed.append("missing" if missing else f"{type(exc).__name__}: {exc}")
        return None
    return cupy


_setup_error: list[str] = []  # a GPU that cannot be used (e.g. a driver too old for CuPy), see _cuda_probe


def _version(read) -> int:
    try:
        return int(read())
    except Exception:  # noqa: BLE001 - no driver / no runtime: unknown
        return 0


def count_error(cp, exc: BaseException) -> str | None:
    """None if ``exc`` (from cudaGetDeviceCount) means no GPU, else what is broken (``_cuda_probe``)."""
    from ._cuda_probe import classify_count_error  # noqa: PLC0415 - only on the failure path

    rt = cp.cuda.runtime
    return classify_count_error(exc, _version(rt.driverGetVersion), _version(rt.runtimeGetVersion))


def _raw_count(cp) -> int:
    try:
        return int(cp.cuda.runtime.getDeviceCount())
    except Exception as exc:  # CUDARuntimeError: no driver / no device, or a driver too old
        broken = count_error(cp, exc)
        if broken is None:
            _log.debug("cudaGetDeviceCount failed (no GPU): %s", exc)
        elif not _setup_error:
            _setup_error.append(broken)
            _log.warning("CUDA is not usable: %s", broken)
        return 0


def device_count() -> int:
    """Number of CUDA GPUs (0 without CuPy or without a GPU)."""
    if _count_cache:
        return _count_cache[0]
    cp = cupy_or_none()
    n = 0 if cp is None else _raw_count(cp)
    if n:
        _count_cache.append(n)
    return n


def is_available() -> bool:
    """True when CuPy is installed and sees at least one GPU."""
    return device_count() > 0


def require_cupy():
    """cupy with at least one GPU, or RuntimeError saying what is missing."""
    cp = cupy_or_none()
    if cp is None:
        why = _import_failed[0] if _import_failed else "unknown"
        if why == "missing":
            raise RuntimeError("CUDA is not available: CuPy is not installed "
                               "(install the 'cuda' extra: pip install 'ndist[cuda]', i.e. cupy-cuda13x[ctk] and NCCL)")
        raise RuntimeError(f"CUDA is not available: CuPy is installed but failed to import ({why})")
    if device_count() == 0:
        if _setup_error:
            raise RuntimeError(f"CUDA is not available: {_setup_error[0]}")
        raise RuntimeError("CUDA is not available: CuPy is installed but no CUDA GPU was found")
    return cp


def check_ordinal(index: int, *, arg: str = "device") -> int:
    n = device_count()
    if not 0 <= index < n:
        raise ValueError(f"{arg}: CUDA ordinal {index} is out of range for {n} CUDA device(s) "
                         f"(valid: 0..{n - 1})")
    return index


# ------------------------------------------------------------ which GPU a rank uses
_launch_local_rank: list[int] = []  # LOCAL_RANK of a launched rank, set by init_process_group (runtime)
_chosen: list[bool] = []  # the program chose a device (set_device, ndist.cuda.device)
_announced: list[int] = []


def choose_device(bound: int | None, current: int, chosen: bool, local_rank: int | None,
                  count: int) -> tuple[int, str]:
    """The CUDA device a rank uses, and why (pure: every input is passed in).

    ``bound``: ``init_process_group(device_id=...)``, as torch's bound device;
    ``current``: the current device of the calling thread; ``chosen``: whether
    the program chose a device itself; ``local_rank``: this rank's local rank
    when a launcher started it (ndistrun, torchrun, mpiexec, srun), else None;
    ``count``: the number of visible GPUs.

    A bound device wins; then a device the program chose (or a current device
    other than 0, which only a choice makes); then, on a launched rank,
    ``local_rank % count`` (ranks on one node get different GPUs, as NCCL
    needs); else the current device.
    """
    if bound is not None:
        if isinstance(bound, bool) or not isinstance(bound, int) or bound < 0 or (count and bound >= count):
            raise ValueError(f"device_id: expected a CUDA ordinal in [0, {count}) ({count} visible GPU(s)), "
                             f"got {bound!r}")
        return bound, f"device_id=cuda:{bound}"
    if chosen or current != 0:
        return current, "the current device"
    if local_rank is not None and count > 0:
        return local_rank % count, f"LOCAL_RANK {local_rank} % {count} visible GPU(s)"
    return current, "the current device"


def set_launch_local_rank(local_rank: int | None) -> None:
    """Called by init_process_group with the launcher's local rank (None: not launched)."""
    _launch_local_rank[:] = [] if local_rank is None else [int(local_rank)]


def device_was_chosen() -> bool:
    return bool(_chosen)


def current_device() -> int:
    """Index of the current CUDA device.

    On a rank started by a launcher that has not chosen a device, that is
    ``LOCAL_RANK % device_count()`` (made current on the calling thread and
    logged at INFO once); see ``choose_device`` and docs/gpu.md.
    """
    cp = require_cupy()
    idx = int(cp.cuda.runtime.getDevice())
    if idx == 0 and _launch_local_rank and not _chosen:
        idx, why = choose_device(None, 0, False, _launch_local_rank[0], device_count())
        if idx != 0:
            cp.cuda.Device(idx).use()
        if not _announced:
            _announced.append(idx)
            _log.info("using cuda:%d (%s): this rank did not choose a device; call ndist.cuda.set_device() "
                      "or pass init_process_group(device_id=...) to choose another", idx, why)
    return idx


def _index_of(dev: Any, *, arg: str = "device", optional: bool = True) -> int:
    """Concrete CUDA ordinal for ``dev`` (None / 'cuda' -> the current device)."""
    if dev is None and optional:
        return current_device()
    if isinstance(dev, int) and not isinstance(dev, bool):
        require_cupy()
        return check_ordinal(dev, arg=arg)
    d = to_device(dev, arg=arg)
    if d.type != "cuda":
        raise ValueError(f"{arg}: expected a CUDA device, got {str(d)!r}")
    require_cupy()
    return current_device() if d.index is None else check_ordinal(d.index, arg=arg)


def resolve(dev: Any, *, arg: str = "device") -> _device_t:
    """A device with a concrete index; validates CUDA availability and the ordinal."""
    d = to_device(dev, arg=arg)
    if d.type == "cpu":
        return CPU
    return _device_t("cuda", _index_of(d, arg=arg))


def set_device(dev: Any) -> None:
    """Make ``dev`` (an int, 'cuda:N' or ndist.device) the current CUDA device.

    A negative int is a no-op, as in torch."""
    if isinstance(dev, int) and not isinstance(dev, bool) and dev < 0:
        return
    cp = require_cupy()
    cp.cuda.Device(_index_of(dev, arg="device", optional=False)).use()
    _chosen[:] = [True]


class device:
    """Context manager that makes a CUDA device current, and restores the old one."""

    def __init__(self, device: Any) -> None:  # noqa: A002 - torch's name
        self.idx = -1 if device is None else (
            device if isinstance(device, int) and device < 0 else _index_of(device))
        self.prev_idx = -1

    def __enter__(self):
        if self.idx >= 0:
            self.prev_idx = current_device()
            _chosen[:] = [True]  # inside the block the program's choice holds, also for device 0
            if self.prev_idx != self.idx:
                set_device(self.idx)
        return self

    def __exit__(self, *exc) -> None:
        if self.idx >= 0 and self.prev_idx != self.idx:
            set_device(self.prev_idx)


class device_of(device):
    """Context manager that makes the device of ``obj`` (a tensor) current; CPU: no-op."""

    def __init__(self, obj: Any) -> None:
        d = obj.device
        super().__init__(d.index if d.type == "cuda" else None)


class _CudaDeviceProperties:
    """torch-style view of ``cudaGetDeviceProperties``: ``.name``, ``.major``, ``.minor``,
    ``.total_memory``, ``.multi_processor_count``; ``props["key"]`` for the raw fields."""

    def __init__(self, raw: dict) -> None:
        self._raw = raw
        name = raw.get("name", b"")
        self.name = name.decode() if isinstance(name, bytes) else str(name)
        self.major, self.minor = int(raw.get("major", 0)), int(raw.get("minor", 0))
        self.total_memory = int(raw.get("totalGlobalMem", 0))
        self.multi_processor_count = int(raw.get("multiProcessorCount", 0))

    def __getitem__(self, key: str) -> Any:
        return self._raw[key]

    def __repr__(self) -> str:
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, "
                f"minor={self.minor}, total_memory={self.total_memory >> 20}MB, "
                f"multi_processor_count={self.multi_processor_count})")


def get_device_properties(dev: Any = None) -> _CudaDeviceProperties:
    cp = require_cupy()
    return _CudaDeviceProperties(cp.cuda.runtime.getDeviceProperties(_index_of(dev)))


def get_device_name(dev: Any = None) -> str:
    return get_device_properties(dev).name


def get_device_capability(dev: Any = None) -> tuple[int, int]:
    p = get_device_properties(dev)
    return p.major, p.minor


def synchronize(dev: Any = None) -> None:
    """Wait for every stream on ``dev`` (default: current device) to finish."""
    cp = require_cupy()
    cp.cuda.Device(_index_of(dev)).synchronize()


def array_guard(arr: Any):
    """Context that makes ``arr``'s GPU current (a no-op for NumPy arrays)."""
    if type(arr).__module__ == "numpy":
        return contextlib.nullcontext()
    return sys.modules["cupy"].cuda.Device(arr.device.id)


def index_guard(index: int):
    return sys.modules["cupy"].cuda.Device(index)


# ---------------------------------------------------------------- streams and events
class Stream:
    """A CUDA stream on a device (wraps ``cupy.cuda.Stream``)."""

    def __init__(self, device: Any = None, priority: int = 0) -> None:  # noqa: A002
        cp = require_cupy()
        self._index = _index_of(device)
        with cp.cuda.Device(self._index):
            # ``priority`` needs CuPy >= 13; the default priority works everywhere.
            self._cp = cp.cuda.Stream(non_blocking=False, priority=priority) \
                if priority else cp.cuda.Stream(non_blocking=False)

    @property
    def device(self) -> _device_t:
        return _device_t("cuda", self._index)

    @property
    def cuda_stream(self) -> int:
        """The raw ``cudaStream_t`` as an int."""
        return int(self._cp.ptr)

    def query(self) -> bool:
        return bool(self._cp.done)

    def synchronize(self) -> None:
        self._cp.synchronize()

    def wait_event(self, event: "Event") -> None:
        self._cp.wait_event(event._cp)

    def wait_stream(self, other: "Stream") -> None:
        self.wait_event(other.record_event())

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = Event() if event is None else event
        event.record(self)
        return event

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and self.cuda_stream == other.cuda_stream \
            and self._index == other._index

    def __hash__(self) -> int:
        return hash((self.cuda_stream, self._index))

    def __repr__(self) -> str:
        return f"<ndist.cuda.Stream device={self.device} cuda_stream={self.cuda_stream:#x}>"


class Event:
    """A CUDA event (wraps ``cupy.cuda.Event``)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False) -> None:
        cp = require_cupy()
        self._cp = cp.cuda.Event(block=blocking, disable_timing=not enable_timing,
                                 interprocess=interprocess)

    def record(self, stream: Stream | None = None) -> None:
        self._cp.record(current_stream()._cp if stream is None else stream._cp)

    def wait(self, stream: Stream | None = None) -> None:
        (current_stream() if stream is None else stream).wait_event(self)

    def query(self) -> bool:
        return bool(self._cp.done)

    def synchronize(self) -> None:
        self._cp.synchronize()

    def elapsed_time(self, end_event: "Event") -> float:
        """Milliseconds between this event and ``end_event`` (both recorded)."""
        return float(sys.modules["cupy"].cuda.get_elapsed_time(self._cp, end_event._cp))

    def __repr__(self) -> str:
        return f"<ndist.cuda.Event {self._cp!r}>"


def current_stream(device: Any = None) -> Stream:  # noqa: A002 - torch's name
    cp = require_cupy()
    idx = _index_of(device)
    with cp.cuda.Device(idx):
        raw = cp.cuda.get_current_stream()
    s = Stream.__new__(Stream)
    s._cp, s._index = raw, idx
    return s


def default_stream(device: Any = None) -> Stream:  # noqa: A002 - torch's name
    cp = require_cupy()
    s = Stream.__new__(Stream)
    s._cp, s._index = cp.cuda.Stream.null, _index_of(device)
    return s


@contextlib.contextmanager
def stream(s: Stream | None):
    """Make ``s`` the current stream (and its device current) inside the block."""
    if s is None:
        yield
        return
    if not isinstance(s, Stream):
        raise TypeError(f"stream: expected an ndist.cuda.Stream or None, got {type(s).__name__}")
    with device(s._index), s._cp:
        yield


# ---------------------------------------------------------------- memory statistics
_peak_alloc: dict[int, int] = {}
_peak_reserved: dict[int, int] = {}


def _pool_stats(dev: Any) -> tuple[int, int, int]:
    cp = require_cupy()
    idx = _index_of(dev)
    with cp.cuda.Device(idx):
        pool = cp.get_default_memory_pool()
        used, total = int(pool.used_bytes()), int(pool.total_bytes())
    _peak_alloc[idx] = max(_peak_alloc.get(idx, 0), used)
    _peak_reserved[idx] = max(_peak_reserved.get(idx, 0), total)
    return idx, used, total


def note_allocation(index: int) -> None:
    """Called after ndist allocates on GPU ``index``: samples the peak statistics."""
    _pool_stats(index)


def memory_allocated(device: Any = None) -> int:  # noqa: A002 - torch's name
    """Bytes held by live arrays in CuPy's default memory pool on ``device``."""
    return _pool_stats(device)[1]


def memory_reserved(device: Any = None) -> int:  # noqa: A002
    """Bytes the pool holds from the driver (live arrays + cached blocks)."""
    return _pool_stats(device)[2]


def max_memory_allocated(device: Any = None) -> int:  # noqa: A002
    """Peak of memory_allocated, sampled at each ndist allocation and stats call."""
    idx = _pool_stats(device)[0]
    return _peak_alloc[idx]


def max_memory_reserved(device: Any = None) -> int:  # noqa: A002
    idx = _pool_stats(device)[0]
    return _peak_reserved[idx]


def reset_peak_memory_stats(device: Any = None) -> None:  # noqa: A002
    idx, used, total = _pool_stats(device)
    _peak_alloc[idx], _peak_reserved[idx] = used, total


def empty_cache() -> None:
    """Return the cached, unused blocks of the current device's pool to the driver."""
    cp = require_cupy()
    cp.get_default_memory_pool().free_all_blocks()
    cp.get_default_pinned_memory_pool().free_all_blocks()


def mem_get_info(device: Any = None) -> tuple[int, int]:  # noqa: A002
    """(free, total) bytes of the GPU, as the driver reports them."""
    cp = require_cupy()
    with cp.cuda.Device(_index_of(device)):
        free, total = cp.cuda.runtime.memGetInfo()
    return int(free), int(total)
