"""ndist.runtime: errors, Work, stores, rendezvous, process groups, the backend
registry and multiprocessing. Imports nothing above it (no collectives, no
backends)."""

from ._errors import (
    DistAuthenticationError,
    DistBackendError,
    DistCaptureError,
    DistError,
    DistMismatchError,
    DistNetworkError,
    DistRankFailureError,
    DistStoreError,
    DistTimeoutError,
    QueueEmptyError,
)
# Everything but the errors loads on first access (PEP 562): ndistrun's agent
# imports ``ndist.runtime.store`` for its store server and needs none of the
# process-group machinery (dataclasses/inspect, urllib, concurrent.futures ...).
_LAZY = {
    "Backend": "_group", "ProcessGroup": "_group",
    "BackendContext": "_registry", "get_backend_spec": "_registry", "register_backend": "_registry",
    "registered_backends": "_registry",
    "register_rendezvous_handler": "_rendezvous",
    "Work": "_work",
    **dict.fromkeys((
        "GroupMember", "default_pg_timeout", "destroy_process_group", "get_backend", "get_global_rank",
        "get_group_rank", "get_process_group_ranks", "get_rank", "get_world_size", "group",
        "init_process_group", "is_available", "is_initialized", "new_group", "new_subgroups",
        "new_subgroups_by_enumeration", "resolve_group", "joined_running_job",
    ), "_world"),
    **dict.fromkeys(("DebugLevel", "get_debug_level", "set_debug_level", "set_debug_level_from_env"),
                    "_debug_level"),
    **dict.fromkeys((
        "BackendConfig", "get_backend_config", "get_default_backend_for_device", "get_node_local_rank",
        "get_pg_count", "is_backend_available", "is_gloo_available", "is_mpi_available", "is_nccl_available",
        "is_torchelastic_launched", "is_ucc_available", "is_xccl_available",
    ), "_query"),
    "split_group": "_split",
    "grow_group": "_grow",
    **dict.fromkeys(("shrink_group", "get_failed_ranks", "SHRINK_DEFAULT", "SHRINK_ABORT"), "_shrink"),
    "DeviceMesh": "_device_mesh", "init_device_mesh": "_device_mesh",
    **dict.fromkeys(("FileStore", "HashStore", "PrefixStore", "Store", "TCPStore", "TCPStoreServer"), "store"),
}

# For the layers above ndist.runtime, not part of ndist.distributed's API (not in __all__).
_INTERNAL = {"world": "_world"}


def __getattr__(name: str):
    module = _LAZY.get(name) or _INTERNAL.get(name)
    if module is None:
        raise AttributeError(f"module 'ndist.runtime' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f"ndist.runtime.{module}"), name)
    globals()[name] = value  # resolve once
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "DistError",
    "DistBackendError",
    "DistNetworkError",
    "DistStoreError",
    "DistTimeoutError",
    "DistMismatchError",
    "DistCaptureError",
    "DistAuthenticationError",
    "DistRankFailureError",
    "QueueEmptyError",
    *_LAZY,
]
