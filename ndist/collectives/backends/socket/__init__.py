"""The socket backend: Gloo-style TCP full mesh with a shared-memory fast path.

Registered as ``"socket"`` (and ``"gloo"``); ``NDIST_TRANSPORT=tcp|shm``
forces one transport between ranks of one host (default: shared memory for
payloads of at least ``SHM_MIN`` bytes, TCP for the rest).
"""

from ._backend import SHM_MIN, TRANSPORT_ENV, SocketBackend

__all__ = ["SocketBackend", "create", "is_available", "SHM_MIN", "TRANSPORT_ENV"]


def create(ctx) -> SocketBackend:
    return SocketBackend(ctx)


def is_available() -> bool:
    return True
