"""What the Python engine's collective streams (``_engine.CollectiveStreams``) do when its op's deadline passes
(``EngineStalls``, one per ``CollectiveStreams``: ``eng.stalls``).

A rank whose op times out tells its peers first (ABORT of kind ``stalled``, with the
global ranks it had not heard from), then gives such notices from others a short grace
(``grace_s``: min(1 s, 10 % of the timeout)) while it still waits. A rank that waits on
a peer which itself waits on a stopped rank (SIGSTOP) times out at about the same moment
as that peer; with the peer's notice it names the rank the peer waited on, the root
cause: ``group 'g': rank 0: broadcast float64[8] root=1 #6 timed out; ranks not heard
from: [2] (rank 1 (host) waited on it)``.

A notice is *first* or *final*. A rank whose deadline passes sends a first one: the root
it knows of so far (a waited-on peer's first notice), else the ranks it waits on; it sends
a refined first notice whenever a waited-on peer's notice changes that root in its grace,
and a final one when it raises (the ranks its error names). A final notice ends a
waiter's grace at once; a first one counts at the grace's end. So in a chain (rank 0
waits on rank 1, rank 1 on rank 2, rank 2 on the stopped rank 3, every deadline passing
within a grace of the others) rank 0 names rank 3, not rank 2. A notice only counts once this rank's own
deadline has passed, and only from a peer this rank still waits on, in this op or one
before it that the peer never got past (any frame the peer sent after it drops it): a healthy
op is never failed by a notice.

A deadline passed here is told to the process's other groups and to its point-to-point
peers too (``on_stalled``, the backend's; ``_stalls``); an idle engine tells its peers of
a deadline passed elsewhere (``tell_stalled_idle``), tagged with its next op's sequence
number, so that the rules above hold unchanged.
"""

from __future__ import annotations

import logging

from .....runtime import DistTimeoutError
from ..wire import _frame as F

__all__ = ["EngineStalls", "grace_s"]

log = logging.getLogger("ndist.collectives.socket")

GRACE_MAX_S = 1.0
GRACE_SHARE = 0.1


def grace_s(timeout: float) -> float:
    """How long a rank whose deadline passed still waits for a peer's timeout notice."""
    return max(0.0, min(GRACE_MAX_S, GRACE_SHARE * timeout))


class EngineStalls:
    """What one ``CollectiveStreams`` does when its op's deadline passes, and the state it keeps for
    that: whether the op is in its grace, what this rank told its peers, the hook to the
    backend (``on_stalled``). The notices peers sent are kept on their connections
    (``conn.stall``)."""

    def __init__(self, eng) -> None:
        self.eng = eng
        self.in_grace = False  # the current op's deadline passed: waiting for notices
        #: ``on_stalled(global ranks)``: told each time this engine's op passes its deadline
        #: (the backend's ``_stalled``: the process's other groups tell their peers)
        self.on_stalled = None
        self.told_stalled = False  # peers hold a notice of this rank: withdrawn at the next op
        self._told_root: list = []  # the ranks this op's first notice named (refined in the grace)

    def deadline_passed(self, expects, now: float) -> None:
        """The deadline passed in ``step``: raise the timeout, or return with the deadline
        moved by the grace (once per op), having told the peers."""
        peers = [e.peer for e in expects if not e.done]
        root, via, final = self._stall_root(peers)
        if root and (final or self.in_grace):
            self._raise_root(root, via)
        if self.eng.op is not None and not self.in_grace:
            self.in_grace = True
            # a first notice: the root this rank knows of so far (a waited-on peer's first
            # notice), else the ranks it waits on; refined in the grace (on_stall_notice)
            self._told_root = root or self.eng.global_ranks(peers)
            self._tell_stalled(self._told_root)
            grace = grace_s(self.eng.timeout)
            if grace > 0 and any(self.eng.conns[p].dead is None for p in peers):
                self.eng.deadline = now + grace
                return
            if root:
                self._raise_root(root, via)
        waiting = self.eng.global_ranks(peers)
        unsent = self.eng.global_ranks(c.peer for c in self.eng.conns.values() if c.out)
        if self.eng.op is not None:
            self._tell_stalled(waiting, final=True)
        raise DistTimeoutError(
            f"group {self.eng.group_name!r}: {self.eng.op.desc if self.eng.op else 'collective'} timed out; "
            f"ranks not heard from: {waiting}" + (f"; ranks not reading: {unsent}" if unsent else ""))

    def _stall_root(self, peers) -> tuple:
        """The ranks the waited-on ``peers`` told (``stalled``) they could not hear from in
        this op or an earlier one, this rank left out; the connections that told; and
        whether every one of those notices is final (its sender raised naming them)."""
        op = self.eng.op
        if op is None:
            return [], [], False
        me = self.eng.granks[self.eng.rank]
        root, via, final = set(), [], True
        for p in peers:
            conn = self.eng.conns[p]
            note = conn.stall
            if note is None or note[0] > op.seq:
                continue
            named = {r for r in note[1] if r != me}
            if named:
                root |= named
                via.append(conn)
                final = final and note[2]
        return sorted(root), via, bool(via) and final

    def _raise_root(self, root, via):
        """Raise the timeout naming ``root`` (told by ``via``), after telling the peers."""
        self._tell_stalled(root, final=True)
        raise self._root_timeout(root, via)

    def _root_timeout(self, root, via) -> DistTimeoutError:
        who = ", ".join(f"rank {c.grank} ({c.host})" for c in via)
        err = DistTimeoutError(
            f"group {self.eng.group_name!r}: {self.eng.op.desc} timed out; ranks not heard from: {root} "
            f"({who} waited on {'it' if len(root) == 1 else 'them'})")
        return err

    def _tell_stalled(self, ranks, final: bool = False) -> None:
        """Tell every peer this op passed its deadline not having heard from ``ranks``
        (global): a first notice, or (``final``) the ranks this rank's error names. Best
        effort, never blocks."""
        op = self.eng.op
        body = F.pack_abort("stalled", f"{op.desc} timed out; ranks not heard from: {list(ranks)}",
                            ranks=ranks, final=final)
        self.eng.tell_peers(body, op.seq, op.root)  # (_engine_loss)
        self.told_stalled = True
        if self.on_stalled is not None:
            try:
                self.on_stalled(list(ranks), final=final)
            except Exception as err:  # noqa: BLE001 - best effort: never hide the timeout
                log.debug("telling the other groups of a stall failed: %s", err)

    def tell_stalled_idle(self, ranks, seq: int, final: bool = False) -> None:
        """Idle here, this process passed a deadline elsewhere (another group, or point to
        point) waiting on global ``ranks``: tell every peer, as of op ``seq`` (the next one
        this rank runs here). A peer waiting on this rank in that op names ``ranks``; any
        frame this rank sends for it drops the notice there. Best effort, never blocks."""
        if self.eng.op is not None or self.eng.broken is not None or self.eng.closing:
            return
        body = F.pack_abort("stalled", f"timed out elsewhere; ranks not heard from: {list(ranks)}",
                            ranks=list(ranks), final=final)
        self.eng.tell_peers(body, seq)
        self.told_stalled = True

    def withdraw_stall(self, op) -> None:
        """This rank goes on here (``begin`` of ``op``): its notice is withdrawn (an empty
        one, as of this op), so that a peer waiting on it later, in an op where this rank
        sent that peer nothing before, does not name the notice's ranks."""
        self.told_stalled = False
        if self.eng.broken is None:
            self.eng.tell_peers(F.pack_abort("stalled", "goes on", ranks=[]), op.seq)

    def on_stall_notice(self, conn, seq: int, info: dict) -> None:
        """A peer's ``stalled`` notice (its op #seq timed out): kept on its connection. An op
        in its grace that waits on that peer raises naming the root cause now when the
        notice is final (the peer raised naming it); a first notice (the peer still waits a
        grace, and may learn of a root further on) only refines this rank's own notice,
        and counts at the end of the grace: a chain of waiting ranks names the stopped rank
        at its end, not the next rank in the chain."""
        ranks = info.get("ranks")
        if not isinstance(ranks, list) or not all(isinstance(r, int) for r in ranks):
            return
        conn.stall = (seq, ranks, info.get("final") is True)
        if not self.in_grace or self.eng.op is None:
            return
        peers = [e.peer for e in self.eng.waiting if not e.done]
        if conn.peer not in peers:
            return
        root, via, final = self._stall_root(peers)
        if root and final:
            self._raise_root(root, via)
        if root and root != self._told_root:
            self._told_root = root
            self._tell_stalled(root)
