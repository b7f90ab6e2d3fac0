"""ndist.runtime: errors, Work, stores, rendezvous, process groups, the backend
registry and multiprocessing. Imports nothing above it (no collectives, no
backends)."""

from ._errors import (
    DistBackendError,
    DistError,
    DistMismatchError,
    DistNetworkError,
    DistStoreError,
    DistTimeoutError,
)
from ._group import Backend, ProcessGroup
from ._registry import BackendContext, get_backend_spec, register_backend, registered_backends
from ._rendezvous import register_rendezvous_handler
from ._work import Work
from ._world import (
    GroupMember,
    default_pg_timeout,
    destroy_process_group,
    get_backend,
    get_global_rank,
    get_group_rank,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    group,
    init_process_group,
    is_available,
    is_initialized,
    new_group,
    new_subgroups,
    new_subgroups_by_enumeration,
    resolve_group,
)
from .store import FileStore, HashStore, PrefixStore, Store, TCPStore, TCPStoreServer

__all__ = [
    "DistError",
    "DistBackendError",
    "DistNetworkError",
    "DistStoreError",
    "DistTimeoutError",
    "DistMismatchError",
    "Work",
    "BackendContext",
    "register_backend",
    "get_backend_spec",
    "registered_backends",
    "register_rendezvous_handler",
    "Store",
    "HashStore",
    "TCPStore",
    "TCPStoreServer",
    "FileStore",
    "PrefixStore",
    "Backend",
    "ProcessGroup",
    "GroupMember",
    "group",
    "default_pg_timeout",
    "init_process_group",
    "destroy_process_group",
    "is_available",
    "is_initialized",
    "get_rank",
    "get_world_size",
    "get_backend",
    "new_group",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "get_group_rank",
    "get_global_rank",
    "get_process_group_ranks",
    "resolve_group",
]
