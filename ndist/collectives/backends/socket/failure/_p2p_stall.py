"""The point-to-point side's timeouts (``P2PStalls``, one per ``_p2p.P2P``: ``p2p.stalls``): a receive from one rank
whose deadline passes tells the process's groups that this rank waits on it
(``on_stalled``, the backend's ``_stalled``: ``_stalls``; with no backend, ABORT
``stalled`` on this side's streams only) and gives a notice from that rank a grace of
min(1 s, 10 % of the timeout): a rank it waits on that is itself stuck waiting on others
(a stopped rank, in a collective or a receive, of any group) makes the receive fail
naming those, the root cause: ``recv on rank 0 from rank 1 (tag 0) did not complete
within 3 s; ranks not heard from: [2] (rank 1 (host) waited on it)``. A notice counts
only once the receive's own deadline has passed (a first notice at the grace's end, a
final one at once: ``_engine_stall``), and is dropped at that peer's next message. A receive from any source fails at its deadline, as before.
"""

from __future__ import annotations

import logging
import time

from .....runtime import DistTimeoutError
from ..wire import _frame as F
from ._engine_stall import grace_s

__all__ = ["P2PStalls"]

log = logging.getLogger("ndist.collectives.socket")


class P2PStalls:
    """What one ``P2P`` side does when a wait passes its deadline, and the state it keeps
    for that: the timeout notices its peers sent (``notes``), the hook to the backend
    (``on_stalled``). Receives are the side's (``p2p.posted``, under ``p2p.lock``)."""

    def __init__(self, p2p) -> None:
        self.p2p = p2p
        #: ``on_stalled(global ranks)``: a receive passed its deadline waiting on them (the
        #: backend's ``_stalled``: every group of the process tells its peers)
        self.on_stalled = None
        #: group rank -> (the global ranks its last timeout notice named, final), until its
        #: next message
        self.notes: dict[int, tuple] = {}

    def expire(self) -> None:
        """Receives past their deadline: one from a rank whose final notice names the ranks
        it waits on fails naming them; any other tells the process's groups (the root it
        knows of so far, from a first notice, else the rank it waits on) and waits a grace
        (once); then it fails naming the root, or the rank it waited on, and tells that."""
        now = time.monotonic()
        failed, stalled = [], set()
        with self.p2p.lock:
            if not self.p2p.posted or min(r.deadline for r in self.p2p.posted) > now:
                return
            keep = []
            for r in self.p2p.posted:
                if r.deadline > now:
                    keep.append(r)
                    continue
                root, final = self.root(r.src)
                if not final and not r.grace and r.src is not None and grace_s(self.p2p.timeout) > 0:
                    r.grace = True
                    r.deadline = now + grace_s(self.p2p.timeout)
                    stalled.update(root or [self.p2p.granks[r.src]])
                    keep.append(r)
                    continue
                failed.append((r, root))
            self.p2p.posted = keep
        named = set()
        for r, root in failed:
            r.work.fail(self.timeout_error(r, root))
            named.update(root or ([self.p2p.granks[r.src]] if r.src is not None else []))
        if stalled:
            self.stalled(stalled)
        if named:
            self.stalled(named, final=True)

    def root(self, src: int | None) -> tuple:
        """(lock held) The global ranks ``src`` told it waits on (this rank left out), and
        whether that notice is final."""
        note = self.notes.get(src) if src is not None else None
        if not note:
            return [], False
        me = self.p2p.granks[self.p2p.rank]
        root = sorted(r for r in note[0] if r != me)
        return root, bool(root) and note[1]

    def notice_of(self, peer: int) -> list:
        """The global ranks ``peer``'s timeout notice names (this rank left out), if any."""
        with self.p2p.lock:
            return self.root(peer)[0]

    def timeout_error(self, r, root: list) -> DistTimeoutError:
        g = self.p2p.granks
        msg = (f"group {self.p2p.group_name!r}: recv on rank {g[self.p2p.rank]} from "
               f"{'any rank' if r.src is None else f'rank {g[r.src]}'} (tag {r.tag}) did not complete "
               f"within {self.p2p.timeout:g} s; ranks not heard from: ")
        if root:
            return DistTimeoutError(f"{msg}{root} (rank {g[r.src]} ({self.p2p.host(r.src)}) waited on "
                                    f"{'it' if len(root) == 1 else 'them'})")
        return DistTimeoutError(f"{msg}{'any source' if r.src is None else [g[r.src]]}")

    def stalled(self, ranks, final: bool = False) -> None:
        if self.on_stalled is not None:
            try:
                self.on_stalled(sorted(ranks), final=final)
            except Exception as err:  # noqa: BLE001 - best effort: never hide the timeout
                log.debug("telling the groups of a stall failed: %s", err)
        else:
            self.tell_stalled(sorted(ranks), final)

    def on_stall_notice(self, peer: int, ranks, final: bool = False) -> None:
        """``peer`` passed a deadline waiting on global ``ranks`` (``final``: it raised
        naming them): kept until its next message. A receive from it in its grace fails
        naming them now when final; a first notice refines this rank's own notice, and
        counts at the end of the grace (``_engine_stall``)."""
        if not isinstance(ranks, list) or not all(isinstance(r, int) for r in ranks):
            return
        with self.p2p.lock:
            old = self.notes.get(peer)
            self.notes[peer] = (ranks, final)
            root, final = self.root(peer)
            waiting = [r for r in self.p2p.posted if r.grace and r.src == peer] if root else []
            hit = waiting if final else []
            if hit:
                self.p2p.posted = [r for r in self.p2p.posted if r not in hit]
        for r in hit:
            r.work.fail(self.timeout_error(r, root))
        if hit:
            self.stalled(root, final=True)
        elif waiting and (old is None or sorted(old[0]) != sorted(ranks)):
            self.stalled(root)  # a refined first notice

    def tell_stalled(self, ranks, final: bool = False) -> None:
        """This process passed a deadline waiting on global ``ranks`` (here or elsewhere;
        ``final``: it raised naming them): tell each live peer this rank has a stream to
        (ABORT ``stalled``). Never blocks."""
        if self.p2p.closed or self.p2p.byes:
            return
        ranks = [int(r) for r in ranks]
        body = F.pack_abort("stalled", f"timed out; ranks not heard from: {ranks}", ranks=ranks, final=final)
        self.p2p.tell(F.pack(F.ABORT, 0, 0, 0, 0, self.p2p.ghash, 0, 0, -1, 0, len(body)) + body, set(), "stalled")

    def send_timeout(self, dst: int, tag: int, err) -> DistTimeoutError:
        """A send whose connection to ``dst`` timed out (it accepted, never answered)."""
        g = self.p2p.granks
        self.stalled([g[dst]], final=True)
        return DistTimeoutError(f"group {self.p2p.group_name!r}: send on rank {g[self.p2p.rank]} to rank {g[dst]} (tag {tag}) "
                                f"did not complete within {self.p2p.timeout:g} s; ranks not heard from: [{g[dst]}] "
                                f"({err})")

    def pending_recv(self, src: int | None, tag: int, work=None) -> str:
        """For ``Work.wait``'s timeout of a receive: whom it waits on. A receive past its own
        deadline (a blocking ``recv`` waits the group timeout) first gives a timeout notice
        of the rank it waits on its grace, as the receive itself does."""
        if src is None:
            return f"waiting for a message from any source (tag {tag}); ranks not heard from: any source"
        g = self.p2p.granks[src]
        with self.p2p.lock:
            r = next((r for r in self.p2p.posted if r.work is work), None) if work is not None else None
        if r is not None and time.monotonic() >= r.due:
            end = r.due + grace_s(self.p2p.timeout) + 0.05
            while not work.is_completed() and time.monotonic() < end:
                time.sleep(0.01)
        with self.p2p.lock:
            root, _ = self.root(src)
        if root:
            return (f"waiting for a message from rank {g} (tag {tag}); ranks not heard from: {root} (rank {g} "
                    f"({self.p2p.host(src)}) waited on {'it' if len(root) == 1 else 'them'})")
        return f"waiting for a message from rank {g} (tag {tag}); ranks not heard from: [{g}]"

    def pending_send(self, dst: int, tag: int, work, running) -> str:
        """For ``Work.wait``'s timeout of a send: whom it waits on, or the send it is queued
        behind (``running``: one to a stopped rank, whose socket buffer is full, say)."""
        if running is not None and running is not work and running.pending is not None:
            return f"queued behind a {running.op}: {running.pending()}"
        g = self.p2p.granks[dst]
        return f"sending to rank {g} (tag {tag}); ranks not heard from: [{g}]"
