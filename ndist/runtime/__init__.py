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
from ._registry import BackendContext, get_backend_spec, register_backend, registered_backends
from ._work import Work
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
    "Store",
    "HashStore",
    "TCPStore",
    "TCPStoreServer",
    "FileStore",
    "PrefixStore",
]
