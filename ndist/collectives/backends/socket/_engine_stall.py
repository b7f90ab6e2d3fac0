"""What the collective engine (``_engine.Engine``) does when its op's deadline passes.

A rank whose op times out tells its peers first (ABORT of kind ``stalled``, with the
global ranks it had not heard from), then gives such notices from others a short grace
(``grace_s``: min(1 s, 10 % of the timeout)) while it still waits. A rank that waits on
a peer which itself waits on a stopped rank (SIGSTOP) times out at about the same moment
as that peer; with the peer's notice it names the rank the peer waited on, the root
cause: ``group 'g': rank 0: broadcast float64[8] root=1 #6 timed out; ranks not heard
from: [2] (rank 1 (host) waited on it)``. A notice only counts once this rank's own
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

from ....runtime import DistTimeoutError
from . import _frame as F

__all__ = ["StallHandling", "grace_s"]

log = logging.getLogger("ndist.collectives.socket")

GRACE_MAX_S = 1.0
GRACE_SHARE = 0.1


def grace_s(timeout: float) -> float:
    """How long a rank whose deadline passed still waits for a peer's timeout notice."""
    return max(0.0, min(GRACE_MAX_S, GRACE_SHARE * timeout))


class StallHandling:
    """The timeout half of ``Engine`` (a mixin: it uses the engine's streams and state)."""

    def _init_stalls(self) -> None:
        self.timeout = 0.0
        self.in_grace = False  # the current op's deadline passed: waiting for notices
        #: ``on_stalled(global ranks)``: told each time this engine's op passes its deadline
        #: (the backend's ``_stalled``: the process's other groups tell their peers)
        self.on_stalled = None
        self.told_stalled = False  # peers hold a notice of this rank: withdrawn at the next op

    def _deadline_passed(self, expects, now: float) -> None:
        """The deadline passed in ``step``: raise the timeout, or return with the deadline
        moved by the grace (once per op), having told the peers."""
        peers = [e.peer for e in expects if not e.done]
        root, via = self._stall_root(peers)
        if root:
            self._tell_stalled(root)
            raise self._root_timeout(root, via)
        first = self.op is not None and not self.in_grace
        if first:
            self.in_grace = True
            self._tell_stalled(self._granks(peers))
            grace = grace_s(self.timeout)
            if grace > 0 and any(self.conns[p].dead is None for p in peers):
                self.deadline = now + grace
                return
        waiting = self._granks(peers)
        unsent = self._granks(c.peer for c in self.conns.values() if c.out)
        raise DistTimeoutError(
            f"group {self.group_name!r}: {self.op.desc if self.op else 'collective'} timed out; "
            f"ranks not heard from: {waiting}" + (f"; ranks not reading: {unsent}" if unsent else ""))

    def _stall_root(self, peers) -> tuple:
        """The ranks the waited-on ``peers`` told (``stalled``) they could not hear from in
        this op or an earlier one, this rank left out; and the connections that told."""
        op = self.op
        if op is None:
            return [], []
        me = self.granks[self.rank]
        root, via = set(), []
        for p in peers:
            conn = self.conns[p]
            note = conn.stall
            if note is None or note[0] > op.seq:
                continue
            named = {r for r in note[1] if r != me}
            if named:
                root |= named
                via.append(conn)
        return sorted(root), via

    def _root_timeout(self, root, via) -> DistTimeoutError:
        who = ", ".join(f"rank {c.grank} ({c.host})" for c in via)
        err = DistTimeoutError(
            f"group {self.group_name!r}: {self.op.desc} timed out; ranks not heard from: {root} "
            f"({who} waited on {'it' if len(root) == 1 else 'them'})")
        return err

    def _tell_stalled(self, ranks) -> None:
        """Tell every peer this op passed its deadline not having heard from ``ranks``
        (global). Best effort, never blocks."""
        op = self.op
        body = F.pack_abort("stalled", f"{op.desc} timed out; ranks not heard from: {list(ranks)}",
                            ranks=ranks)
        self._tell_peers(body, op.seq, op.root)  # (_engine_loss)
        self.told_stalled = True
        if self.on_stalled is not None:
            try:
                self.on_stalled(list(ranks))
            except Exception as err:  # noqa: BLE001 - best effort: never hide the timeout
                log.debug("telling the other groups of a stall failed: %s", err)

    def tell_stalled_idle(self, ranks, seq: int) -> None:
        """Idle here, this process passed a deadline elsewhere (another group, or point to
        point) waiting on global ``ranks``: tell every peer, as of op ``seq`` (the next one
        this rank runs here). A peer waiting on this rank in that op names ``ranks``; any
        frame this rank sends for it drops the notice there. Best effort, never blocks."""
        if self.op is not None or self.broken is not None or self.closing:
            return
        body = F.pack_abort("stalled", f"timed out elsewhere; ranks not heard from: {list(ranks)}",
                            ranks=list(ranks))
        self._tell_peers(body, seq)
        self.told_stalled = True

    def withdraw_stall(self, op) -> None:
        """This rank goes on here (``begin`` of ``op``): its notice is withdrawn (an empty
        one, as of this op), so that a peer waiting on it later, in an op where this rank
        sent that peer nothing before, does not name the notice's ranks."""
        self.told_stalled = False
        if self.broken is None:
            self._tell_peers(F.pack_abort("stalled", "goes on", ranks=[]), op.seq)

    def on_stall_notice(self, conn, seq: int, info: dict) -> None:
        """A peer's ``stalled`` notice (its op #seq timed out): kept on its connection; an
        op in its grace that waits on that peer raises naming the root cause now."""
        ranks = info.get("ranks")
        if not isinstance(ranks, list) or not all(isinstance(r, int) for r in ranks):
            return
        conn.stall = (seq, ranks)
        if not self.in_grace or self.op is None:
            return
        if any(e.peer == conn.peer and not e.done for e in self._waiting):
            root, via = self._stall_root([conn.peer])
            if root:
                self._tell_stalled(root)
                raise self._root_timeout(root, via)
