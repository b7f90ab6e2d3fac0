"""ndist.cuda: CUDA device selection, streams, events and memory statistics
(mirrors ``torch.cuda``; implemented on CuPy in ``ndist.tensor._cuda``).

Importing this module does not import CuPy; the first call that needs a GPU does.
Without CuPy or without a GPU, ``is_available()`` is False and every other call
raises ``RuntimeError`` saying which is missing.
"""

from .tensor._cuda import (
    Event,
    Stream,
    current_device,
    current_stream,
    default_stream,
    device,
    device_count,
    device_of,
    empty_cache,
    get_device_capability,
    get_device_name,
    get_device_properties,
    is_available,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    reset_peak_memory_stats,
    set_device,
    stream,
    synchronize,
)
from .tensor._random import cuda_manual_seed as manual_seed
from .tensor._random import cuda_manual_seed_all as manual_seed_all

__all__ = [
    "is_available", "device_count", "current_device", "set_device", "device", "device_of",
    "get_device_name", "get_device_capability", "get_device_properties", "synchronize",
    "Stream", "Event", "current_stream", "default_stream", "stream", "memory_allocated",
    "max_memory_allocated", "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats",
    "empty_cache", "mem_get_info", "manual_seed", "manual_seed_all",
]
