"""What every public collective shares: resolving the group, choosing the
backend for the tensors' device, submitting, writing staged outputs back and
waiting (``async_op=False``) or returning the Work (``async_op=True``)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..runtime import resolve_group
from . import _check, _debug
from ._backend import DONE

__all__ = ["member_group", "submit", "Post"]

_P2P = frozenset(("send", "recv"))

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


def _failed(rec, slot, seq: int, exc: BaseException | None) -> None:
    from ..runtime import DistNetworkError, DistTimeoutError

    rec.done(slot, seq, exc)
    if isinstance(exc, (DistTimeoutError, DistNetworkError)):
        _debug.dump_all(f"{slot.op if slot is not None else 'operation'} #{seq} in group "
                        f"{rec.group_name!r} failed: {type(exc).__name__}: {exc}")


def submit(pg, device: str, method: str, args: Sequence[Any], async_op: Any,
           post: list[Callable[[], None]] | None = None, outputs: Any = None, backend: Any = None):
    """Call ``backend.method(*args)``; wait unless ``async_op``; return the Work or None.

    Every call is recorded in the group's flight recorder; with
    ``NDIST_DEBUG=DETAIL`` collectives first compare call signatures across
    ranks through the group's store (``_debug``).
    """
    if async_op is not False:
        async_op = _check.check_bool("async_op", async_op)
    if backend is None:
        backend = pg.backend_for(device)
    rec = _debug.recorder_for(pg)
    seq = rec.next_seq(device if method not in _P2P else device + ":p2p")  # p2p numbered apart, as backends do
    described = _debug.describe_args(method, args)
    dtype, cin, cout, root, _redop, _ins, _outs = described
    slot = rec.issue(seq, method, device, dtype, cin, cout, root)
    try:
        if rec.detail and method not in _P2P:
            _debug.check_signature(pg, device, seq, method, described)
        if not async_op and getattr(backend, "blocking_calls", False):
            work = getattr(backend, method)(*args, blocking=True)
            if work is DONE:  # finished and succeeded: nothing to wait on
                if post:
                    for step in post:
                        step()
                rec.done(slot, seq, None)
                return None
        else:
            work = getattr(backend, method)(*args)
    except BaseException as exc:
        _failed(rec, slot, seq, exc)
        raise
    if post:
        steps = list(post)

        def _write_back() -> None:
            for step in steps:
                step()

        work = work.then(_write_back)
    if async_op:
        if outputs is not None:
            work._outputs = outputs
        fut = getattr(work, "_future", None)  # CUDA works make theirs lazily: not forced here
        if fut is not None:
            fut.add_done_callback(lambda f: _failed(rec, slot, seq, f.exception()))
        work._on_timeout = lambda exc: _debug.dump_all(
            f"{method} #{seq} in group {rec.group_name!r}: Work.wait timed out: {exc}")
        return work
    try:
        wait_sync(work, pg)
    except BaseException as exc:
        _failed(rec, slot, seq, exc)
        raise
    rec.done(slot, seq, None)
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
