"""What every public collective shares: resolving the group, choosing the
backend for the tensors' device, submitting, writing staged outputs back and
waiting (``async_op=False``) or returning the Work (``async_op=True``)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..runtime import resolve_group
from . import _check
from ._backend import DONE

__all__ = ["member_group", "submit", "Post"]

Post = list  # list[Callable[[], None]]: write-backs run after the backend finished


def member_group(group: Any):
    """The ProcessGroup for ``group``; ValueError when this process is not in it."""
    pg = resolve_group(group)
    if not pg.is_member:
        me = resolve_group(None).rank()
        raise ValueError(
            f"group: this process (global rank {me}) is not a member of group {pg.group_name!r} "
            f"with ranks {list(pg.ranks)}"
        )
    return pg


def submit(pg, device: str, method: str, args: Sequence[Any], async_op: Any,
           post: list[Callable[[], None]] | None = None, outputs: Any = None, backend: Any = None):
    """Call ``backend.method(*args)``; wait unless ``async_op``; return the Work or None."""
    if async_op is not False:
        async_op = _check.check_bool("async_op", async_op)
    if backend is None:
        backend = pg.backend_for(device)
    if not async_op and getattr(backend, "blocking_calls", False):
        work = getattr(backend, method)(*args, blocking=True)
        if work is DONE:  # finished and succeeded: nothing to wait on
            if post:
                for step in post:
                    step()
            return None
    else:
        work = getattr(backend, method)(*args)
    if post:
        steps = list(post)

        def _write_back() -> None:
            for step in steps:
                step()

        work = work.then(_write_back)
    if async_op:
        if outputs is not None:
            work._outputs = outputs
        return work
    wait_sync(work, pg)
    return None


def wait_sync(work, pg) -> None:
    """``async_op=False``: wait for ``work`` within the group timeout.

    A stream-ordered Work (nccl's CudaWork) is only made the current stream's
    dependency, as torch does: the call returns once the op is enqueued, and
    the backend's watchdog enforces the timeout.
    """
    if getattr(work, "stream_ordered", False):
        work.wait()
    else:
        work.wait(pg.timeout)
