"""The point-to-point side's losses (``_p2p.P2P``, a mixin): a peer found unreachable,
left or lost; a ``lost`` notice from a peer; the relay of a loss to every peer this rank
has a stream to (ABORT of kind ``lost``, after any message it sent them), once, on a
thread of its own, so that a survivor waiting on a live rank fails at once, not at the
group timeout. ``_p2p``'s docstring ("Failure") gives the contract.
"""

from __future__ import annotations

import logging
import threading
import time

from ....runtime import DistNetworkError
from . import _frame as F
from ._p2p_stream import Stream as _Stream
from ._p2p_stream import send_ctl as _send_ctl

__all__ = ["P2PLosses"]

log = logging.getLogger("ndist.collectives.socket")

#: a relayed notice is written within this long (a peer that does not read in that
#: time learns of the loss by other means: its own streams, or its timeout)
_RELAY_S = 5.0


class P2PLosses:
    """The loss half of ``P2P`` (it uses the side's lock, receives, streams and maps)."""

    def _unreachable(self, peer: int, err) -> DistNetworkError:
        """A send to, or a connection with, ``peer`` failed: it left, or it is lost."""
        with self._lock:
            gone = self._gone.get(peer) or (peer in self._leaving or None)
        if gone is not None:
            host = self._host(peer)
            return gone if gone is not True else DistNetworkError(
                f"group {self.group_name!r}: rank {self.granks[peer]} ({host}) has left the group "
                f"(destroy_process_group() or exit): {err}", rank=self.granks[peer], host=host)
        other = self._gindex.get(err.rank) if isinstance(err, DistNetworkError) else None
        if other is not None and other != peer:
            # waiting to connect to ``peer``, another member was found dead (the mesh looks
            # at every member): that member is the loss, not the peer we were dialling
            return self._peer_lost(other, err)
        return self._peer_lost(peer, err)

    def _known_dead(self, peer: int) -> bool:
        try:
            return self._mesh().is_dead(peer)
        except Exception:  # noqa: BLE001 - no mesh (closing)
            return False

    def _peer_lost(self, peer: int, err, vouched: bool = True) -> DistNetworkError:
        host, gpeer = self._host(peer), self.granks[peer]
        exc = err if isinstance(err, DistNetworkError) and err.rank == gpeer else DistNetworkError(
            f"group {self.group_name!r}: lost point-to-point connection to rank {gpeer} ({host}): "
            f"{err or 'connection closed'}", rank=gpeer, host=host)
        with self._lock:
            exc = self._dead.setdefault(peer, exc)
            first = self._broken is None
            if first:
                self._broken = exc
            failed, self._posted = self._posted, []
        if first and vouched:
            self._relay(exc, skip={peer})
            # the group first (it revokes), then the waiters: a receive woken below raises
            # the group's DistRankFailureError, not this plain error (Work.on_error)
            self._tell_backend(exc, str(exc).split(": ", 1)[1] if str(exc).startswith("group ") else str(exc))
        for r in failed:
            r.work.fail(exc)
        return exc

    def _tell_backend(self, exc: DistNetworkError, message: str) -> None:
        if self.on_loss is not None and exc.rank is not None:
            try:
                self.on_loss(exc.rank, exc.host, message)
            except Exception as err:  # noqa: BLE001 - the loss itself is already recorded here
                log.debug("recording the loss of rank %s failed: %s", exc.rank, err)

    def _on_notice(self, st: _Stream, info: dict) -> None:
        """A peer tells us the group lost a rank: fail everything pending, tell ours."""
        if info.get("kind") == "stalled":
            self._on_stall_notice(st.peer, info.get("ranks"), info.get("final") is True)
            return
        if info.get("kind") != "lost":
            return
        dead, host = info.get("rank"), info.get("host")
        if not isinstance(dead, int) or dead not in self._gindex:
            dead = None
        host = host if isinstance(host, str) else None
        reported = f"rank {self.granks[st.peer]} ({self._host(st.peer)}) reported: {info.get('msg')}"
        if self.record_lost(dead, host, reported, skip=st.peer) and dead is not None:
            self._tell_backend(self._broken, reported)

    def record_lost(self, dead: int | None, host, message: str, skip: int | None = None) -> bool:
        """The group lost global rank ``dead`` (told by a peer's notice, or by the
        backend's collective side): fail every pending receive and every later one, and
        tell each peer we have a stream to (but ``skip``, a group rank), once. Any
        thread; True when this was news here."""
        exc = DistNetworkError(f"group {self.group_name!r}: rank {dead} ({host}) is lost; {message}", rank=dead,
                               host=host)
        gdead = self._gindex.get(dead) if dead is not None else None
        with self._lock:
            if self._broken is not None:
                return False
            self._broken = exc
            if gdead is not None:
                self._dead.setdefault(gdead, exc)
            failed, self._posted = self._posted, []
        for r in failed:
            r.work.fail(exc)
        self._relay(exc, skip={skip, gdead})
        return True

    def _relay(self, exc: DistNetworkError, skip: set) -> None:
        """Tell each live peer this rank has a stream to that the group lost
        ``exc.rank``: on our own stream to it when there is one (after the messages
        we sent it), else on its stream to us. Never blocks the caller."""
        if self._closed:
            return
        msg = str(exc)
        msg = msg.split(": ", 1)[1] if msg.startswith("group ") else msg
        body = F.pack_abort("lost", msg, exc.rank, exc.host)
        frame = F.pack(F.ABORT, 0, 0, 0, 0, self.ghash, 0, 0, -1, 0, len(body)) + body
        self._tell(frame, skip, f"rank {exc.rank} is lost")

    def _tell(self, frame: bytes, skip: set, what: str) -> None:
        """Write ``frame`` to each live peer with a stream (ours when there is one), on
        a thread of its own: never blocks the caller."""
        with self._lock:
            targets: dict[int, _Stream] = {}
            for st in self._streams.values():
                if st.ended or st.peer in skip or st.peer in self._dead or st.peer in self._gone:
                    continue
                if st.peer not in targets or (st.outgoing and not targets[st.peer].outgoing):
                    targets[st.peer] = st
        if not targets:
            return

        def tell() -> None:
            deadline = time.monotonic() + _RELAY_S
            for st in targets.values():
                if st.wlock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    try:
                        _send_ctl(st.sock, frame, deadline)
                    finally:
                        st.wlock.release()
            log.debug("rank %d told ranks %s: %s", self.rank, sorted(targets), what)

        threading.Thread(target=tell, name=f"ndist-p2p-relay-{self.group_name}-{self.rank}", daemon=True).start()
