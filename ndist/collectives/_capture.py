"""CUDA graph capture: which operations record into a graph, which waits are refused.

A collective issued on a CUDA stream that is being captured (``cupy.cuda.Stream``
with ``begin_capture()``, ``cupy.cuda.Graph``, ``torch.cuda.graph``) is not run:
it is recorded, and runs at every replay of the graph. What the nccl backend
enqueues on the stream (NCCL calls, device copies, the casts and scalings of
its reduction plans) can be recorded; what needs the host in the middle of the
operation cannot, and is refused with a ``DistCaptureError`` naming the op and
why, before anything is enqueued:

* a **host-staged** op (CUDA arrays through the socket or mpi backend): it
  copies to host memory and exchanges on the CPU, which a graph cannot replay;
* a **barrier**: the host waits for the all_reduce it issues;
* a **coalescing block** (``batch_isend_irecv``): its works are tracked by an
  event recorded after ``groupEnd``, which the backend does not record into a
  graph;
* a **blocking host wait** on a Work while the caller's stream is capturing, or
  on a Work recorded into a graph: ``wait(timeout)``, ``synchronize()``,
  ``is_completed()`` / ``is_success()`` / ``exception()`` (an event query) and
  ``get_future()``. The op has not run (it runs at each replay); the host has
  nothing to wait for. ``wait()`` without a timeout orders the current stream
  after the op: allowed for a Work recorded in the same capture.

Pure Python (no CuPy): the table is tested on machines without a GPU.
"""

from __future__ import annotations

from ..runtime import DistCaptureError

__all__ = ["RECORDED", "REFUSED_WAITS", "op_refusal", "wait_refusal", "work_method", "capture_error"]

#: what the nccl backend records into a graph (every op it has but those below)
REFUSED_OPS = {
    "barrier": "a barrier waits on the host for the all_reduce it issues",
    "coalescing": "the works of a coalescing block (batch_isend_irecv) are tracked by an event recorded after "
                  "groupEnd, which ndist does not record into a graph; issue the sends and receives one by one",
}
RECORDED = frozenset({"all_reduce", "reduce", "reduce_scatter", "broadcast", "all_gather", "gather", "scatter",
                      "all_to_all", "send", "recv"})
STAGED_WHY = ("a host-staged op (CUDA arrays through a CPU backend) copies the data to host memory and exchanges "
              "it on the CPU, which a CUDA graph cannot record; use the nccl backend for collectives inside a "
              "capture, or issue this one outside it")

#: Work methods that block the host or query the op's event
REFUSED_WAITS = {
    "wait(timeout)": "it blocks the host until the op finished",
    "synchronize": "it blocks the host until the op finished",
    "is_completed": "it queries the op's CUDA event",
    "is_success": "it queries the op's CUDA event",
    "exception": "it queries the op's CUDA event",
    "get_future": "its Future completes when the op's CUDA event fires",
}


def op_refusal(op: str, *, staged: bool) -> str | None:
    """Why ``op`` cannot be issued on a capturing stream (None: it records into the graph).

    ``staged``: the op goes through host staging (a CPU backend serving CUDA arrays).
    """
    if staged:
        return STAGED_WHY
    if op in REFUSED_OPS:
        return REFUSED_OPS[op]
    if op in RECORDED:
        return None
    raise ValueError(f"op: expected one of {sorted(RECORDED | set(REFUSED_OPS))}, got {op!r}")


def wait_refusal(method: str, *, captured: bool, capturing: bool, finished: bool) -> str | None:
    """Why ``method`` of a Work cannot be called now (None: it can).

    ``captured``: the Work's op was recorded into a graph (it runs at each replay);
    ``capturing``: the caller's current stream is being captured;
    ``finished``: the Work already completed or failed (nothing left to wait for).
    """
    if method == "wait":  # no timeout: a stream dependency
        if captured and not capturing:
            return ("its op was recorded into a CUDA graph and runs at each replay; order work after the "
                    "graph's launch instead")
        if capturing and not captured and not finished:
            return ("its op was issued before the capture began, and a graph cannot wait for work outside "
                    "it; synchronize before capturing")
        return None
    why = REFUSED_WAITS.get(method)
    if why is None:
        raise ValueError(f"method: expected 'wait' or one of {sorted(REFUSED_WAITS)}, got {method!r}")
    if captured:
        return f"{why}, and its op was recorded into a CUDA graph: it runs at each replay, not now"
    if capturing and not finished:
        return f"{why}, which a stream being captured does not allow"
    return None


def work_method(method: str) -> str:
    """How an error names a Work method of the tables above: ``Work.synchronize()``,
    ``Work.wait(timeout)``."""
    return f"Work.{method}" if "(" in method else f"Work.{method}()"


def capture_error(op: str, seq: int | None, what: str, why: str) -> DistCaptureError:
    """The error for ``what`` (an op or a wait) refused during capture."""
    where = f"{op} (#{seq})" if seq is not None else op
    return DistCaptureError(f"{where}: {what} is not allowed in CUDA graph capture: {why}")
