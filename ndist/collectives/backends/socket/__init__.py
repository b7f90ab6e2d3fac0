"""The socket backend: Gloo-style TCP links (opened as collectives need them) with a shared-memory fast path.

Registered as ``"socket"`` (and ``"gloo"``); ``NDIST_TRANSPORT=tcp|shm``
forces one transport between ranks of one host (default: shared memory for
payloads of at least ``SEGMENT_MIN`` bytes, TCP for the rest).
"""

from ._backend import SEGMENT_MIN, TRANSPORT_ENV, SocketBackend

__all__ = ["SocketBackend", "create", "is_available", "SEGMENT_MIN", "TRANSPORT_ENV"]


def create(ctx):
    """A SocketBackend; for ``ctx.device == "cuda"`` one that stages CuPy arrays through
    pinned host memory (several ranks can then share one GPU)."""
    backend = SocketBackend(ctx)
    if ctx.device == "cuda":
        from ..._staging import wrap_for_cuda

        return wrap_for_cuda(backend)
    return backend


def is_available() -> bool:
    return True
