"""The Python half of the engine's C interface (``ndist_engine.h``, ``capi.c``; docs/native.md,
"The C interface"): a group's handle, and the bookkeeping of the calls through the table that
the group's C core (``clane.c``, ``_fast.core``) does not take, with the GIL, before and after
the op; and ``failure``, the core's hook when an op it ran failed.

The bookkeeping is the Python path's own, step for step (the repeated call: ``run_fields`` of
the public layer, then the socket backend's thin lane, ``SocketBackend._inline``), so calls
through the table and through ``ndist.distributed`` mix on one group:

* ``begin``: the reduce op checked against the dtype (as the public layer does, before any
  number is taken); the call numbered by the lane's counter and its flight-recorder entry
  written (DETAIL: its signature compared across ranks); the group's lane claimed
  (``Executor.claim``: busy, and the backend's sequence number that goes into the headers),
  waiting for queued work first; a broken group's first failure raised again; the op described
  for messages (``NativeAlgorithms.op``);
* ``end``: AVG finished (``finalize``, as ``lane_all_reduce``), a failure mapped to its typed
  error (``SocketBackend._native_failure``), the lane left, the outcome recorded (``_failed``:
  the recorder, its dump, a revoked group's ``DistRankFailureError``).

Both return ``None`` / a token, or an error tuple ``(status, rank, usable, type, message)``
that C copies into the caller's ``ndist_error``. ``end`` returns ``(error,)`` when the op ran
but waking the executor's worker after it failed: the call's status stays ``OK`` (its result is
valid) and C reports the error (sys.unraisablehook), as the C core does (``clane.c``'s ``leave``).
"""

from __future__ import annotations

import time

import numpy as np

from .....runtime import DistError, DistMismatchError, DistNetworkError, DistTimeoutError
from ...._backend import Call, Op
from ...._reduce_op import ReduceOp
from ..schedules._reduce import finalize
from ..wire import _frame as F
from ._engine import RSAG_MIN
from ._twolevel import compiled

__all__ = ["Handle", "OK", "ARGUMENT", "PEER_LOST", "TIMEOUT", "MISMATCH", "BROKEN", "CLOSED", "INTERRUPTED",
           "INTERNAL"]

# ndist_engine.h's ndist_status (tests/collectives/backends/test_native_capi.py checks they agree)
OK, ARGUMENT, PEER_LOST, TIMEOUT, MISMATCH, BROKEN, CLOSED, INTERRUPTED, INTERNAL = range(9)

# op codes of the C engine (common.h) -> (the record's op, the name in messages)
_OPS = {1: (Op.ALL_REDUCE, "all_reduce"), 3: (Op.BROADCAST, "broadcast"), 4: (Op.ALL_GATHER_INTO, "all_gather"),
        7: (Op.ALL_TO_ALL_SINGLE, "all_to_all"), 8: (Op.REDUCE_SCATTER_FROM, "reduce_scatter"),
        9: (Op.BARRIER, "barrier")}
_AVG, _PREMUL = 5, 9


class _Refused(Exception):
    """``begin``: the group refused the call before it ran (broken, or closed): ``args[0]`` is
    the error the Python path raises, ``args[1]`` the status."""


def _dtype(code: int) -> np.dtype:
    name = F.dtype_name(code)
    try:
        return np.dtype(name)
    except TypeError:
        try:
            import ml_dtypes  # bfloat16 and the float8s (the backends' own dtypes come from it too)
        except ImportError:
            raise ValueError(f"dtype: code {code} ({name}) needs ml_dtypes, which is not installed") from None
        return np.dtype(getattr(ml_dtypes, name))


def _dtype_or_none(code: int):
    """NumPy's dtype of wire code ``code`` for the C core's record, None where there is none
    (code 0, or ml_dtypes' dtypes without ml_dtypes: the hooks take those calls)."""
    if code == 0:
        return None
    try:
        return _dtype(code)
    except (ValueError, TypeError):
        return None


def classify(exc: BaseException, usable: bool, status: int | None = None) -> tuple:
    """The error tuple of ``exc`` (what the Python path raises for the call)."""
    if status is None:
        if isinstance(exc, (ValueError, TypeError)):
            status, usable = ARGUMENT, True
        elif isinstance(exc, DistTimeoutError):
            status = TIMEOUT
        elif isinstance(exc, DistMismatchError):
            status = MISMATCH
        elif isinstance(exc, DistNetworkError):
            status = PEER_LOST
        elif isinstance(exc, KeyboardInterrupt):
            status = INTERRUPTED
        elif isinstance(exc, DistError):
            status = BROKEN
        else:
            status = INTERNAL
    rank = getattr(exc, "rank", None)
    return (status, rank if isinstance(rank, int) else -1, int(usable), type(exc).__name__, str(exc))


class Handle:
    """One group's C interface handle: its entry in ``capi.c``'s table and the hooks it calls.

    ``backend``: the group's ``SocketBackend`` (its lane: ``claim_lane`` / ``leave_lane``, and
    ``native_failure``); ``nat``: its ``NativeAlgorithms`` over a same-host ``Group``, a
    ``TcpGroup`` or a ``TwoLevelGroup`` (its ``TwoGroup`` is the handle's group);
    ``book``: the public layer's lane book (counter, recorder append or None, DETAIL, group,
    recorder); ``failed``, ``reduce_op``, ``check_signature``, ``t_done``: the public layer's
    ``_failed``, ``_check.reduce_op``, ``_debug.check_signature`` and ``_debug.T_DONE``;
    ``wake``: the executor's ``wake`` (``end``, when leaving the lane could not wake it)."""

    def __init__(self, backend, nat, book, failed, reduce_op, check_signature, t_done: int, lane=None,
                 wake=None) -> None:
        self.backend, self.nat, self.wake = backend, nat, wake
        self.book, self.failed, self.reduce_op = book, failed, reduce_op
        self.check_signature, self.t_done = check_signature, t_done
        self.size = nat.size
        self._dtypes: dict = {}
        if lane is None:
            self.value = nat.mod.capi_open(compiled(nat.g), self.begin, self.end, RSAG_MIN)
        else:  # the group's C core takes what it can (no Python-level call), the hooks the rest
            self.value = nat.mod.capi_open(compiled(nat.g), self.begin, self.end, RSAG_MIN, lane, self.failure,
                                           tuple(_dtype_or_none(c) for c in range(len(F._DTYPES))))

    def close(self) -> None:
        """Calls on the handle return NDIST_E_CLOSED from now on (one in flight finishes)."""
        self.nat.mod.capi_close(self.value)

    def _usable(self) -> bool:
        return self.nat.broken is None and not self.nat.g.broken and not self.backend.closed

    # ------------------------------------------------------------ the hooks
    def begin(self, op: int, dcode: int, count_in: int, count_out: int, root: int, redop: int, out, inp,
              out_counts=None, in_counts=None):
        """(``out_counts`` / ``in_counts``: ``all_to_all_v``'s split sizes in elements, else None)"""
        record_op, name = _OPS[op]
        try:  # what the public layer checks first: nothing numbered yet
            dtype = self._dtypes.get(dcode)
            if dtype is None and op != 9:
                dtype = self._dtypes[dcode] = _dtype(dcode)
            rop = None
            if redop:
                rop, _ = self.reduce_op(ReduceOp[F.REDOPS[redop]], dtype)
        except (ValueError, TypeError) as exc:
            return classify(exc, True)
        seqs, record, detail, pg, rec = self.book
        seq = next(seqs)
        root_r = root if op == 3 else None
        entry = None
        if record is not None:
            entry = [seq, record_op, "cpu", dtype, count_in, count_out, root_r, time.time(), None, None]
            record(entry)
        nat = self.nat
        try:
            if detail:
                self.check_signature(pg, seq, self._call(record_op, dtype, out, inp, root_r, rop, out_counts,
                                                         in_counts))
            bseq = self.backend.claim_lane()
        except BaseException as exc:  # noqa: BLE001 - recorded, and told to the caller
            return self._refused(exc, entry, seq)
        try:
            if nat.broken is not None:  # as the thin lane: the first failure, again
                raise _Refused(nat.broken, BROKEN)
            nat.g.seq = bseq
            count = count_out if op in (8,) else count_in
            nat.op = (name, dcode, count, bseq, root if op == 3 else -1, rop)
            fb = nat._redinfo(dtype, rop)[3] if rop is not None else None
        except BaseException as exc:  # noqa: BLE001
            self.backend.leave_lane()
            return self._refused(exc, entry, seq)
        return ((entry, seq, rop, out, dtype), fb)

    def end(self, token, err):
        entry, seq, rop, out, dtype = token
        nat = self.nat
        exc = None
        try:
            if err is not None:
                exc = self.backend.native_failure(nat, err)
            elif rop is not None and out is not None and rop._value_ in (ReduceOp.AVG._value_,
                                                                          ReduceOp.PREMUL_SUM._value_):
                finalize(np.frombuffer(out, dtype), rop, None, self.size)
        except BaseException as e:  # noqa: BLE001
            exc = e
        if exc is not None:
            self.backend.leave_lane()
            return self._error(exc, entry, seq, None)
        try:
            self.backend.leave_lane()
        except BaseException as e:  # noqa: BLE001 - the op ran: its status stays OK (``_woken``)
            woken = self._woken(e)
        else:
            woken = None
        if entry is not None:
            entry[self.t_done] = time.time()
        return woken

    def _woken(self, err: BaseException) -> tuple:
        """After an op that ran, leaving the lane cleared the flag (``Executor.leave`` clears it
        first) but waking the worker for a queued job failed with ``err``: the worker is woken
        once more (so that a one-off failure strands no job), and ``(err,)`` goes back to C,
        which reports it and returns OK (when the second wake fails too, its error, whose
        context is ``err``)."""
        if self.wake is not None:
            try:
                self.wake()
            except BaseException as again:  # noqa: BLE001 - reported in err's place, err its context
                return (again,)
        return (err,)

    def failure(self, err, entry, seq):
        """The C core's failure hook (``capi.c``'s ``run_core``: the op failed, the claim still
        held): what ``end`` does with a failure."""
        try:
            exc = self.backend.native_failure(self.nat, err)
        except BaseException as e:  # noqa: BLE001
            exc = e
        finally:
            self.backend.leave_lane()
        return self._error(exc, entry, seq, None)

    # ------------------------------------------------------------ failures
    def _refused(self, exc, entry, seq):
        status = None
        if isinstance(exc, _Refused):
            exc, status = exc.args
        return self._error(exc, entry, seq, status)

    def _error(self, exc, entry, seq, status):
        """Record ``exc`` as ``run_fields`` does (``_failed``, which may raise the group's
        ``DistRankFailureError`` instead) and return its error tuple."""
        rec = self.book[4]
        try:
            self.failed(rec, entry, seq, exc)
        except BaseException as mapped:  # noqa: BLE001
            exc = mapped
        if status is None and self.backend.closed and isinstance(exc, DistError):
            status = CLOSED
        return classify(exc, self._usable(), status)

    def _call(self, record_op, dtype, out, inp, root, rop, out_splits=None, in_splits=None) -> Call:
        """The ``Call`` the Python path records (NDIST_DEBUG=DETAIL compares it across ranks)."""
        def arr(v):
            return np.empty(0, dtype) if v is None else np.frombuffer(v, dtype)

        if record_op is Op.BARRIER:
            return Call(Op.BARRIER, "cpu")
        if record_op in (Op.ALL_REDUCE, Op.BROADCAST):
            return Call(record_op, "cpu", dtype, out=arr(out), root=root, redop=rop)
        return Call(record_op, "cpu", dtype, out=arr(out), inp=arr(inp), out_splits=out_splits, in_splits=in_splits,
                    redop=rop)
