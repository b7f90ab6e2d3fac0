"""Diagnostics every backend gets: the flight recorder and ``NDIST_DEBUG=DETAIL``
call-signature checks.

Flight recorder: the last ``NDIST_FLIGHT_RECORDER_SIZE`` (default 64; 0 turns
it off) operations per process group are kept in a ring (op, device, dtype,
element counts, root, sequence number, state issued / completed / failed,
timestamps): one small list per operation, appended to a bounded deque and
updated in place when it ends (its state follows from its fields); no lock
and nothing formatted on the hot path. Where the socket backend's native
engine runs, the recorder adopts its C ring and counters (``adopt``): the
repeated call in C writes its entries there as numbers, and every reader sees
the same lists in the same order. When an operation fails with a timeout,
a lost peer or a mismatch (a call refused by a revoked group included), the rings of every group are logged at ERROR and
written to ``$NDIST_FLIGHT_RECORDER_DIR/rank<global rank>.json`` when that
variable is set, and in torch's dump format to ``$NDIST_FR_DUMP<global rank>``
(``_fr_torch``) when that one is. ``ndist.distributed.flight_recorder(group)``
returns a group's entries.

``NDIST_DEBUG=DETAIL``: before each collective every rank publishes its call
signature (op, dtype, counts, root, reduce op) under the group's store and
compares it with every other rank's, so a mismatched call fails on every rank
with ``DistMismatchError`` naming both calls, before the backend sees it. The
socket backend already checks frame headers on every op; this adds the same
guarantee in front of MPI and NCCL, which have none. Every ProcessGroup has a
store (MPI jobs started without ``MASTER_ADDR`` get one from the MPI
rendezvous); a group without one (``store is None``) skips the check with a
single warning. The sequence numbers used here count the collectives issued
through the public API on a (group, device) pair, as the socket backend does.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
import weakref
from collections import deque
from typing import Any

from .. import __version__
from ..runtime import world as _world

__all__ = ["FlightRecorder", "recorder_for", "flight_recorder", "dump_all", "check_signature"]

log = logging.getLogger("ndist.collectives.debug")

SIZE_ENV = "NDIST_FLIGHT_RECORDER_SIZE"
DIR_ENV = "NDIST_FLIGHT_RECORDER_DIR"
DUMP_ENV = "NDIST_FR_DUMP"  # a prefix: also write torch's dump format (``_fr_torch``)
_DEFAULT_SIZE = 64


# ------------------------------------------------------------------ recorder
#: What an entry of the ring holds, by position: one list per operation, built
#: when it is issued and updated in place when it ends (a list is several times
#: cheaper to build and update than an object's attributes). Its state is not
#: stored: ``issued`` until ``time_done`` is set, then ``completed``, or
#: ``failed`` when ``error`` is set too.
FIELDS = ("seq", "op", "device", "dtype", "count_in", "count_out", "root", "time_issued", "time_done", "error")
OP, T_ISSUED, T_DONE, ERROR = 1, 7, 8, 9  # positions the collectives read or update in place


def _as_dict(entry: list) -> dict:
    d = dict(zip(FIELDS[:T_ISSUED], entry))
    d["op"] = str(d["op"])
    d["dtype"] = None if d["dtype"] is None else str(d["dtype"])
    t_issued, t_done, error = entry[T_ISSUED], entry[T_DONE], entry[ERROR]
    d["state"] = "issued" if t_done is None else "completed" if error is None else "failed"
    d["time_issued"], d["time_done"], d["error"] = t_issued, t_done, error
    d["duration_s"] = None if t_done is None else round(t_done - t_issued, 6)
    return d


class FlightRecorder:
    """The ring of one process group (see the module docstring).

    Lock-free on the hot path: sequence numbers come from ``itertools.count``
    and entries are appended to a ``deque(maxlen=size)`` (one C call each,
    atomic under the GIL), so the ring holds them in issue order; each
    operation gets its own entry list, and one pushed out of the ring by later
    operations is simply no longer listed.

    ``adopt`` swaps both for the socket backend's C twins (``_cnative.Ring`` and
    ``Counter``, native/crecord.c), which C writes without a Python object:
    ``ring.append`` / ``ring.copy()`` and ``next(counter)`` work as before.
    """

    def __init__(self, group_name: str, global_rank: int, size: int) -> None:
        self.group_name = group_name
        self.global_rank = global_rank
        self.size = size
        #: the entries, oldest first: a ``deque`` or an adopted ring (``append``, ``copy()``, ``len``)
        self.ring: Any = deque(maxlen=size)
        #: ``record(entry)``: append an entry (the oldest drops out of a full ring)
        self.record = self.ring.append
        self._seqs: dict[str, Any] = {}
        self._count: Any = itertools.count  # makes a counter from its first number
        # read once per group, like the rest of NDIST_DEBUG (a per-call os.environ lookup
        # cost ~0.8 us, more than recording the op)
        from ..runtime._debug_level import DebugLevel, get_debug_level  # NDIST_DEBUG or set_debug_level()

        self.detail = get_debug_level() is DebugLevel.DETAIL
        #: a weak reference to the group (set by ``recorder_for``): a failure maps through it
        self.group = None

    def counter(self, key: str):
        """The iterator numbering the operations of ``key`` (a device, or ``"<device>:p2p"``)
        from 1: an ``itertools.count``, or the adopted counter type's."""
        c = self._seqs.get(key)
        if c is None:
            c = self._seqs.setdefault(key, self._count(1))
        return c

    def adopt(self, ring_type, counter_type) -> bool:
        """From now on, entries go to a ``ring_type(maxlen)`` (when the ring has a size) and
        numbers come from ``counter_type(start)`` counters, which carry on where the old ones
        stopped, with the entries already recorded carried over in order. True when it
        switched; False when these are the recorder's types already. The caller refreshes what
        holds the old ``record`` or counters (``_common.Lane.rebook``)."""
        if self._count is counter_type:
            return False
        for key, old in list(self._seqs.items()):
            self._seqs[key] = counter_type(next(old))  # (the number the old one would give next)
        self._count = counter_type
        if self.size:
            ring = ring_type(self.size)
            for entry in self.ring.copy():
                ring.append(entry)
            self.ring, self.record = ring, ring.append
        return True

    def issued(self) -> int:
        """How many numbers the counters have handed out, all keys together."""
        total = 0
        for c in list(self._seqs.values()):
            last = getattr(c, "last", None)  # an adopted counter: its last number
            if last is None:  # itertools.count: "count(n)", n the next one
                text = repr(c)
                last = int(text[text.index("(") + 1:text.rindex(")")]) - 1
            total += last
        return total

    def next_seq(self, device: str) -> int:
        return next(self.counter(device))

    def issue(self, seq: int, call, count_in: int | None = None, count_out: int | None = None) -> list | None:
        """Record ``call`` (a ``Call``) as issued with sequence number ``seq``; the entry
        (``None`` when the ring has size 0). ``count_in`` / ``count_out``: the call's
        ``totals()``, when the caller knows them."""
        size = self.size
        if not size:
            return None
        if count_in is None:
            count_in, count_out = call.totals()
        entry = [seq, call.op, call.device, call.dtype, count_in, count_out, call.root, time.time(), None, None]
        self.record(entry)
        return entry

    @staticmethod
    def done(entry: list | None, seq: int, exc: BaseException | None) -> None:
        if entry is None or entry[T_DONE] is not None:  # (ended already)
            return
        if exc is not None:
            entry[ERROR] = f"{type(exc).__name__}: {exc}"
        entry[T_DONE] = time.time()

    def entries(self) -> list[dict]:
        return [_as_dict(e) for e in self.ring.copy()]  # (a copy: one C call, atomic under the GIL)


_recorders: "weakref.WeakKeyDictionary[Any, FlightRecorder]" = weakref.WeakKeyDictionary()
_recorders_lock = threading.Lock()


def _ring_size() -> int:
    raw = os.environ.get(SIZE_ENV, "")
    try:
        return max(0, int(raw)) if raw.strip() else _DEFAULT_SIZE
    except ValueError:
        log.warning("%s: expected a non-negative int, got %r; using %d", SIZE_ENV, raw, _DEFAULT_SIZE)
        return _DEFAULT_SIZE


def recorder_for(pg) -> FlightRecorder:
    rec = _recorders.get(pg)
    if rec is None:
        with _recorders_lock:
            rec = _recorders.get(pg)
            if rec is None:
                rec = _recorders[pg] = FlightRecorder(pg.group_name, pg.ranks[pg.rank()] if pg.is_member else -1,
                                                      _ring_size())
                rec.group = weakref.ref(pg)
    return rec


def flight_recorder(group=None) -> list[dict]:
    """The flight-recorder entries of ``group`` (default: the world), oldest first."""
    from ..runtime import resolve_group

    pg = resolve_group(group)
    rec = _recorders.get(pg)
    return rec.entries() if rec is not None else []


def dump_all(reason: str, log_ring: bool = True) -> str | None:
    """Log every group's ring at ERROR (``log_ring``: a mismatch's error already names both
    calls, so it writes the files only); write it to ``$NDIST_FLIGHT_RECORDER_DIR`` (JSON)
    and, in torch's format, to ``$NDIST_FR_DUMP<rank>`` (``_fr_torch``). Returns the JSON's path."""
    with _recorders_lock:
        pairs = list(_recorders.items())
    if not pairs:
        return None
    recs = [rec for _, rec in pairs]
    rank = recs[0].global_rank
    data = {"rank": rank, "pid": os.getpid(), "reason": reason, "time": time.time(),
            "groups": {r.group_name: r.entries() for r in recs}}
    text = json.dumps(data, indent=1)
    if log_ring:
        log.error("flight recorder of rank %d (%s):\n%s", rank, reason, text)
    prefix = os.environ.get(DUMP_ENV)
    if prefix:
        # loaded here, not at import: only a job that asks for torch's format pays for the module
        from . import _fr_torch  # noqa: PLC0415 - import cost of `import ndist.distributed`

        path = _fr_torch.write_torch_dump(prefix, rank, _fr_torch.torch_dump(pairs, _world.default, __version__))
        if path is not None:
            log.error("flight recorder of rank %d written for torch's analyzer to %s", rank, path)
    folder = os.environ.get(DIR_ENV)
    if not folder:
        return None
    path = os.path.join(folder, f"rank{rank}.json")
    try:
        os.makedirs(folder, exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as err:
        log.error("cannot write the flight recorder to %s: %s", path, err)
        return None
    return path


# --------------------------------------------------------------- signatures
def _call(rank: int, sig: dict) -> str:
    text = f"rank {rank}: {sig['op']} {sig['dtype']}[{sig['count']}]"
    if sig.get("root") is not None:
        text += f" root={sig['root']}"
    if sig.get("redop"):
        text += f" {sig['redop']}"
    return f"{text} #{sig['seq']}"


#: ops whose element count must be the same on every rank (the others are checked per peer)
_EXACT = ("all_reduce", "reduce", "broadcast")
_warned_no_store: set = set()


def check_signature(pg, seq: int, call) -> None:
    """``NDIST_DEBUG=DETAIL``: compare ``call`` (a ``Call``) with every rank's through the store."""
    from ..runtime import DistMismatchError, DistTimeoutError

    store = getattr(pg, "store", None)
    if store is None:
        if pg.group_name not in _warned_no_store:
            _warned_no_store.add(pg.group_name)
            log.warning("NDIST_DEBUG=DETAIL: group %r has no store; collective signatures are not checked",
                        pg.group_name)
        return
    me, size = pg.rank(), pg.size()
    method, device, dtype, root, redop = call.op.value, call.device, call.dtype, call.root, call.redop
    cin, cout, ins, outs = call.counts(size)
    count = cout if method in _COUNT_OUT else cin
    sig = {"op": method, "dtype": None if dtype is None else str(dtype), "count": count, "root": root,
           "redop": None if redop is None else getattr(redop, "name", str(redop)), "seq": seq,
           "ins": ins, "outs": outs}
    base = f"ndist_detail/{device}"
    store.set(f"{base}/{seq}/{me}", json.dumps(sig))
    keys = [f"{base}/{seq}/{r}" for r in range(size)]
    seconds = pg.timeout.total_seconds()
    try:
        store.wait(keys, seconds)
    except DistTimeoutError:
        missing = [pg.ranks[r] for r, k in enumerate(keys) if not store.check([k])]
        raise DistTimeoutError(
            f"NDIST_DEBUG=DETAIL: {method} #{seq} in group {pg.group_name!r}: ranks not heard from within "
            f"{seconds:g} s: {missing}") from None
    sigs = [json.loads(v) for v in store.multi_get(keys)]
    if seq > 1:  # every rank has read our key of seq - 1: it published seq after its own check
        try:
            store.delete_key(f"{base}/{seq - 1}/{me}")
        except Exception:  # noqa: BLE001 - cleanup only
            pass
    mine = sigs[me]
    mine_call = _call(pg.ranks[me], mine)
    for r, other in enumerate(sigs):
        if r == me:
            continue
        theirs = _call(pg.ranks[r], other)
        same = (other["op"] == mine["op"] and other["dtype"] == mine["dtype"] and other["root"] == mine["root"]
                and other["redop"] == mine["redop"])
        if same and method in _EXACT and other["count"] != mine["count"]:
            same = False
        if not same:
            raise DistMismatchError(f"collective mismatch in group {pg.group_name!r} (NDIST_DEBUG=DETAIL): "
                                    f"{mine_call}; {theirs}")
        # per-peer sizes: what I receive from r must be what r sends me
        want = _expected_from(method, mine, r, me, root)
        sent = _sent_to(method, other, me, r, root)
        if want is not None and sent is not None and want != sent:
            raise DistMismatchError(
                f"collective mismatch in group {pg.group_name!r} (NDIST_DEBUG=DETAIL): {mine_call} expects "
                f"{want} elements from rank {pg.ranks[r]}; {theirs} sends {sent}")
        want = _expected_from(method, other, me, r, root)
        sent = _sent_to(method, mine, r, me, root)
        if want is not None and sent is not None and want != sent:
            raise DistMismatchError(
                f"collective mismatch in group {pg.group_name!r} (NDIST_DEBUG=DETAIL): {mine_call} sends "
                f"{sent} elements to rank {pg.ranks[r]}; {theirs} expects {want}")


#: ops whose signature counts what the rank receives (its output), not what it contributes
_COUNT_OUT = ("scatter", "reduce_scatter", "reduce_scatter_from")
_PER_PEER_IN = ("all_gather", "all_gather_into", "all_to_all", "all_to_all_single")
_PER_PEER_OUT = ("all_to_all", "all_to_all_single", "reduce_scatter", "reduce_scatter_from")


def _expected_from(method, sig, src, me, root):
    """Elements the rank with signature ``sig`` (group rank ``me``) receives from ``src``."""
    if method in _PER_PEER_IN or (method == "gather" and me == root):
        outs = sig["outs"]
        return outs[src] if outs else None
    if method in ("reduce_scatter", "reduce_scatter_from") or (method == "scatter" and src == root):
        return sig["count"]
    return None


def _sent_to(method, sig, dst, me, root):
    """Elements the rank with signature ``sig`` (group rank ``me``) sends to ``dst``."""
    if method in _PER_PEER_OUT or (method == "scatter" and me == root):
        ins = sig["ins"]
        return ins[dst] if ins else None
    if method in ("all_gather", "all_gather_into") or (method == "gather" and dst == root):
        return sig["count"]
    return None
