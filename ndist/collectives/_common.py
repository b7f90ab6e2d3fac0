"""What every public collective shares: the group it runs on, and ``submit``:
number and record the call, run it on the backend, write staged outputs back,
and wait (``async_op=False``) or return the Work (``async_op=True``)."""

from __future__ import annotations

import logging
import os
import threading
from time import time as _time
from typing import Any, Callable

from ..runtime import DistMismatchError, DistNetworkError, DistRankFailureError, DistTimeoutError, resolve_group, world
from . import _check, _debug
from ._backend import DONE, Call, Op
from ._debug import OP, T_DONE

__all__ = ["member_group", "backend_of", "submit", "run_fields", "lane_for", "Lane", "wait_sync"]

log = logging.getLogger("ndist.collectives")

#: a network error naming a member the group does not know lost yet waits this long for the
#: member watch to see its watch connection end (``_World.await_loss``), then this long in
#: all for the watch's verdict
_LOSS_GRACE_S = 0.2
_LOSS_WAIT_S = 1.0

_warned_groups: set = set()
_warned_lock = threading.Lock()


def member_group(group: Any, what: str = "collective"):
    """The ProcessGroup for ``group``, or ``None`` when this process is not a member.

    torch's semantics: an operation on a group this rank is not in does nothing
    and returns ``None`` (``recv``: -1), with a warning, once per group here.
    """
    pg = resolve_group(group)
    if pg.is_member:
        return pg
    key = (id(pg), pg.group_name)
    with _warned_lock:
        first = key not in _warned_groups
        _warned_groups.add(key)
    if first:
        me = resolve_group(None).rank()
        log.warning("%s on group %r (ranks %s) called by global rank %d, which is not a member: it does "
                    "nothing and returns None, as in torch (warned once per group)", what, pg.group_name,
                    list(pg.ranks), me)
    return None


class Lane:
    """What a collective on one (group, device type) needs after its checks, in one
    lookup (``pg.lanes[device]``): the group, its backend, its flight recorder, the
    sequence counters and whether ``NDIST_DEBUG=DETAIL`` checks signatures."""

    __slots__ = ("pg", "device", "rank", "size", "group_rank", "backend", "rec", "seqs", "p2p_seqs", "detail",
                 "book", "all_reduce", "broadcast", "all_gather_into", "reduce_scatter_from", "all_to_all_single")

    def __init__(self, pg, device: str) -> None:
        self.pg, self.device = pg, device
        self.rank, self.size = pg.rank(), pg.size()
        self.group_rank = {r: i for i, r in enumerate(pg.ranks)}  # global rank -> group rank
        self.backend = pg.backend_for(device)
        self.rec = rec = _debug.recorder_for(pg)
        self.detail = rec.detail
        # a backend that records in C (the socket backend's native engine: ``recorder_types``)
        # hands the recorder its ring and counters first; the group's other lanes hold the old ones
        types = self.backend.recorder_types()
        if types is not None and rec.adopt(*types):
            for other in list(pg.lanes.values()):
                other.rebook()
        self.rebook()
        # the backend's methods the repeated-call path calls, bound once
        backend = self.backend
        self.all_reduce, self.broadcast = backend.all_reduce, backend.broadcast
        self.all_gather_into, self.reduce_scatter_from = backend.all_gather_into, backend.reduce_scatter_from
        self.all_to_all_single = backend.all_to_all_single

    def rebook(self) -> None:
        """Take the recorder's counters and ring (again, after ``FlightRecorder.adopt``)."""
        rec, device = self.rec, self.device
        self.seqs = rec.counter(device)
        self.p2p_seqs = rec.counter(device + ":p2p")  # p2p numbered apart, as backends do
        # for ``run_fields``: what it reads, in one tuple (the recorder's append, None without one)
        self.book = (self.seqs, rec.record if rec.size else None, self.detail, self.pg, rec)


def lane_for(pg, device: str) -> Lane:
    """The Lane of ``pg`` (a group this process is a member of) for ``device``.

    Made on the first call that passed its checks; the group forgets it when
    destroyed (``ProcessGroup.lanes``), so a lane found there is live.
    """
    lane = pg.lanes.get(device)
    if lane is None:
        lane = pg.lanes.setdefault(device, Lane(pg, device))
        if pg.destroyed:  # destroyed meanwhile by another thread: forget it again
            pg.lanes.pop(device, None)
            pg.require_alive()
    return lane


def _record_failed(rec, entry, seq: int, exc: BaseException | None) -> None:
    """Record a failed op in the flight recorder (and dump it, for a timeout, a network
    error or a mismatch). Raises nothing and waits on nothing: an async op's done hook calls
    it on the thread that completed the Work (its waiter raises the mapped error, through
    ``Work.on_error``)."""
    rec.done(entry, seq, exc)
    if isinstance(exc, (DistTimeoutError, DistNetworkError, DistMismatchError)):
        _debug.dump_all(f"{entry[OP] if entry is not None else 'operation'} #{seq} in group "
                        f"{rec.group_name!r} failed: {type(exc).__name__}: {exc}",
                        log_ring=not isinstance(exc, DistMismatchError))


def _failed(rec, entry, seq: int, exc: BaseException | None) -> None:
    """Record a failed op (``_record_failed``); a network error of a revoked group is raised
    as the group's ``DistRankFailureError`` (the error every op of the group raises, naming
    the lost members), with the backend's own error as its cause."""
    _record_failed(rec, entry, seq, exc)
    if isinstance(exc, (DistTimeoutError, DistNetworkError, DistMismatchError)):
        # (the recorder's own group: a group of torch's backend "ndist" is not in ndist's world)
        pg = rec.group() if rec.group is not None else world.groups.get(rec.group_name)
        if pg is not None:
            mapped = _revoked_error(pg, exc)
            if mapped is not exc:
                raise mapped from exc


def _revoked_error(pg, exc: BaseException) -> BaseException:
    """What ``wait`` raises for a Work that failed with ``exc``: a network error of a
    revoked group is the group's ``DistRankFailureError`` (``exc`` its cause), as for a
    blocking op (``_failed``): a p2p op or async collective in flight when a member died."""
    if isinstance(exc, DistNetworkError) and not isinstance(exc, DistRankFailureError):
        failure = pg.failure(exc)
        peer = getattr(exc, "rank", None)
        verdict = pg.loss_verdict or world.await_loss
        if failure is None and peer in pg.ranks and peer != pg.ranks[pg.rank()] and \
                verdict(peer, _LOSS_GRACE_S, min(_LOSS_WAIT_S, pg.timeout.total_seconds())):
            # the op found the peer gone before the member watch told the group: its
            # verdict (died, or exited) is a moment away, and every loss is this error
            failure = pg.failure(exc)
        if failure is not None:
            failure.__cause__ = exc
            return failure
    return exc


_new_call = tuple.__new__  # a Call from its fields in order (_api.py checks the order once)


def run_fields(book: tuple, method: Callable[..., Any], count_in: int, count_out: int, *fields: Any) -> None:
    """The repeated call's ``submit``: a collective on the CPU with ``async_op=False`` and
    nothing staged, numbered, recorded (the entry ``submit`` writes, inline) and checked
    (DETAIL) as ``submit`` does, for the public layer's plain paths. ``book`` is the lane's ``book``
    (counter, flight recorder's append or None, DETAIL, group, recorder), ``fields``
    the ``Call``'s fields in order; the record's op, dtype and root are the call's own.
    Where the compiled ``_crun`` is built (and ``NDIST_ENGINE`` is not ``python``) its
    C twin replaces this function below: the same steps, in the same order."""
    seqs, record, detail, pg, rec = book
    call = _new_call(Call, fields)
    seq = next(seqs)
    if record is not None:
        entry = [seq, fields[0], fields[1], fields[2], count_in, count_out, fields[9], _time(), None, None]
        record(entry)
    else:
        entry = None
    try:
        if detail:
            _debug.check_signature(pg, seq, call)
        work = method(call, blocking=True)
        if work is not DONE:
            wait_sync(work, pg)
    except BaseException as exc:
        _failed(rec, entry, seq, exc)
        raise
    if entry is not None:
        entry[T_DONE] = _time()


def _compiled_run_fields():
    """``_crun.run_fields`` set up with what it calls, or None: not built, or the
    Python reference asked for (``NDIST_ENGINE=python``: no compiled code on the path)."""
    if os.environ.get("NDIST_ENGINE", "").strip().lower() == "python":
        return None
    try:
        from . import _crun
    except ImportError:  # no compiler at install: the socket backend's engine warns once for both
        return None
    _crun.setup(Call, DONE, _debug.check_signature, _failed, wait_sync, T_DONE)
    return _crun.run_fields


def submit(pg, method: Callable[..., Any], call: Call, async_op: Any,
           post: list[Callable[[], None]] | None = None, outputs: Any = None):
    """Run ``method(call)`` (a bound method of ``pg``'s backend: ``backend_of``); wait
    unless ``async_op``.

    Returns the Work (``async_op=True``) or None. Every call is numbered and
    recorded in the group's flight recorder (a call refused by a revoked group in
    ``backend_of``); with ``NDIST_DEBUG=DETAIL`` collectives first compare their
    records across ranks through the group's store (``_debug``). ``post`` are
    write-backs of staged outputs, run once the backend is done; ``outputs`` is
    what the async Work's ``result()`` gives.
    """
    if async_op is not False:
        async_op = _check.check_bool("async_op", async_op)
    lane = lane_for(pg, call.device)
    rec = lane.rec
    p2p = call.op is Op.SEND or call.op is Op.RECV  # (not `in P2P_OPS`: Enum.__hash__ is Python code)
    seq = next(lane.p2p_seqs if p2p else lane.seqs)
    slot = rec.issue(seq, call)
    try:
        if lane.detail and not p2p:
            _debug.check_signature(pg, seq, call)
        work = method(call, blocking=not async_op)
        if work is DONE:  # finished and succeeded: nothing to wait on
            if post:
                for step in post:
                    step()
            rec.done(slot, seq, None)
            return None if not async_op else _completed(call, seq, outputs)
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
            work.outputs = outputs
        if not getattr(work, "stream_ordered", False):  # CUDA works make their Future lazily: not forced
            work.add_done_hook(lambda w: _record_failed(rec, slot, seq, w.error))
        work.on_error = lambda exc: _revoked_error(pg, exc)
        work.on_timeout = lambda exc: _debug.dump_all(
            f"{call.op} #{seq} in group {rec.group_name!r}: Work.wait timed out: {exc}")
        return work
    try:
        wait_sync(work, pg)
    except BaseException as exc:
        _failed(rec, slot, seq, exc)
        raise
    rec.done(slot, seq, None)
    return None


def backend_of(pg, call: Call):
    """The backend that runs ``call`` on ``pg`` (a member): its lane's, the lane made on
    the first call. A revoked group has forgotten its lanes and ``backend_for`` raises the
    group's error; the call is still numbered, recorded as failed with that error, and the
    flight recorder dumped, as for an operation that failed in flight (a survivor told of
    the loss between two calls leaves the same record as one whose call was running)."""
    try:
        return lane_for(pg, call.device).backend
    except DistRankFailureError as exc:
        rec = _debug.recorder_for(pg)
        p2p = call.op is Op.SEND or call.op is Op.RECV
        seq = next(rec.counter(call.device + ":p2p" if p2p else call.device))
        _failed(rec, rec.issue(seq, call), seq, exc)
        raise


def _completed(call: Call, seq: int, outputs: Any):
    from ..runtime import Work

    return Work.completed(str(call.op), seq, outputs)


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


_run_fields_py = run_fields  # the reference, kept by name (tests run both twins)
run_fields = _compiled_run_fields() or run_fields  # (here: it needs wait_sync, defined above)
