"""The point-to-point side's losses (``P2PLosses``, one per ``_p2p.P2P``: ``p2p.losses``): a peer found unreachable,
left or lost; a ``lost`` notice from a peer; the relay of a loss to every peer this rank
has a stream to (ABORT of kind ``lost``, after any message it sent them), once, on a
thread of its own, so that a survivor waiting on a live rank fails at once, not at the
group timeout. ``_p2p``'s docstring ("Failure") gives the contract.
"""

from __future__ import annotations

import logging

from .....runtime import DistNetworkError
from ..wire import _frame as F

__all__ = ["P2PLosses"]

log = logging.getLogger("ndist.collectives.socket")



class P2PLosses:
    """What one ``P2P`` side does when the group loses a member: fail its receives, relay
    the loss to its peers, tell the backend (``on_loss``). The side's maps of lost and
    departed peers (``p2p.dead``, ``p2p.gone``, ``p2p.broken``) stay the side's: every
    send and receive reads them, under the side's lock."""

    def __init__(self, p2p, on_loss=None) -> None:
        self.p2p = p2p
        #: ``on_loss(global_rank, host, message)``: a loss this side found out first (the
        #: backend's ``GroupFailure.record``, which tells the collective side)
        self.on_loss = on_loss

    def unreachable(self, peer: int, err) -> DistNetworkError:
        """A send to, or a connection with, ``peer`` failed: it left, or it is lost."""
        with self.p2p.lock:
            gone = self.p2p.gone.get(peer) or (peer in self.p2p.leaving or None)
        if gone is not None:
            host = self.p2p.host(peer)
            return gone if gone is not True else DistNetworkError(
                f"group {self.p2p.group_name!r}: rank {self.p2p.granks[peer]} ({host}) has left the group "
                f"(destroy_process_group() or exit): {err}", rank=self.p2p.granks[peer], host=host)
        other = self.p2p.gindex.get(err.rank) if isinstance(err, DistNetworkError) else None
        if other is not None and other != peer:
            # waiting to connect to ``peer``, another member was found dead (the mesh looks
            # at every member): that member is the loss, not the peer we were dialling
            return self.peer_lost(other, err)
        return self.peer_lost(peer, err)

    def known_dead(self, peer: int) -> bool:
        try:
            return self.p2p.mesh().is_dead(peer)
        except Exception:  # noqa: BLE001 - no mesh (closing)
            return False

    def peer_lost(self, peer: int, err, vouched: bool = True) -> DistNetworkError:
        host, gpeer = self.p2p.host(peer), self.p2p.granks[peer]
        exc = err if isinstance(err, DistNetworkError) and err.rank == gpeer else DistNetworkError(
            f"group {self.p2p.group_name!r}: lost point-to-point connection to rank {gpeer} ({host}): "
            f"{err or 'connection closed'}", rank=gpeer, host=host)
        with self.p2p.lock:
            exc = self.p2p.dead.setdefault(peer, exc)
            first = self.p2p.broken is None
            if first:
                self.p2p.broken = exc
            failed, self.p2p.posted = self.p2p.posted, []
        if first and vouched:
            self.relay(exc, skip={peer})
            # the group first (it revokes), then the waiters: a receive woken below raises
            # the group's DistRankFailureError, not this plain error (Work.on_error)
            self.tell_backend(exc, str(exc).split(": ", 1)[1] if str(exc).startswith("group ") else str(exc))
        for r in failed:
            r.work.fail(exc)
        return exc

    def tell_backend(self, exc: DistNetworkError, message: str) -> None:
        if self.on_loss is not None and exc.rank is not None:
            try:
                self.on_loss(exc.rank, exc.host, message)
            except Exception as err:  # noqa: BLE001 - the loss itself is already recorded here
                log.debug("recording the loss of rank %s failed: %s", exc.rank, err)

    def on_notice(self, sender: int, info: dict) -> None:
        """Group rank ``sender`` tells us the group lost a rank: fail everything pending,
        tell ours."""
        if info.get("kind") == "stalled":
            self.p2p.stalls.on_stall_notice(sender, info.get("ranks"), info.get("final") is True)
            return
        if info.get("kind") != "lost":
            return
        dead, host = info.get("rank"), info.get("host")
        # (a global rank; not always a member: a group aborted for a process outside it,
        # ``ProcessGroup.revoke_for``, tells its peers that process, and this group is
        # revoked for it too: ``report_loss``, through ``on_loss``)
        if not isinstance(dead, int) or isinstance(dead, bool) or dead < 0:
            dead = None
        host = host if isinstance(host, str) else None
        reported = f"rank {self.p2p.granks[sender]} ({self.p2p.host(sender)}) reported: {info.get('msg')}"
        if dead is not None and self.on_loss is not None:  # the group first (it revokes), then the waiters
            try:
                self.on_loss(dead, host, reported)
            except Exception as err:  # noqa: BLE001 - the receives still fail below
                log.debug("recording the loss of rank %s failed: %s", dead, err)
        self.record_lost(dead, host, reported, skip=sender)

    def record_lost(self, dead: int | None, host, message: str, skip: int | None = None) -> bool:
        """The group lost global rank ``dead`` (told by a peer's notice, or by the
        backend's collective side): fail every pending receive and every later one, and
        tell each peer we have a stream to (but ``skip``, a group rank), once. Any
        thread; True when this was news here."""
        exc = DistNetworkError(f"group {self.p2p.group_name!r}: rank {dead} ({host}) is lost; {message}", rank=dead,
                               host=host)
        gdead = self.p2p.gindex.get(dead) if dead is not None else None
        with self.p2p.lock:
            if self.p2p.broken is not None:
                return False
            self.p2p.broken = exc
            if gdead is not None:
                self.p2p.dead.setdefault(gdead, exc)
            failed, self.p2p.posted = self.p2p.posted, []
        for r in failed:
            r.work.fail(exc)
        self.relay(exc, skip={skip, gdead})
        return True

    def relay(self, exc: DistNetworkError, skip: set) -> None:
        """Tell each live peer this rank has a stream to that the group lost
        ``exc.rank``: on our own stream to it when there is one (after the messages
        we sent it), else on its stream to us. Never blocks the caller."""
        if self.p2p.closed:
            return
        msg = str(exc)
        msg = msg.split(": ", 1)[1] if msg.startswith("group ") else msg
        body = F.pack_abort("lost", msg, exc.rank, exc.host)
        frame = F.pack(F.ABORT, 0, 0, 0, 0, self.p2p.ghash, 0, 0, -1, 0, len(body)) + body
        self.p2p.tell(frame, skip, f"rank {exc.rank} is lost")
