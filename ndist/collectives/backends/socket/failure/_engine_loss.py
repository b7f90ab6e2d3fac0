"""What the Python engine's collective streams (``_engine.CollectiveStreams``) do when the group loses a member
(``EngineLosses``, one per ``CollectiveStreams``: ``eng.losses``).

A rank that loses a peer's connection during an op tells every other peer at
once (ABORT of kind ``lost``): the group is broken, and a survivor may be
waiting on this rank rather than on the dead one. A loss another part of the
backend learned of (its point-to-point side; ``GroupFailure.record``)
reaches the engine through ``notify_lost``: from any thread, it wakes the op
waiting in ``poll`` (a pipe the loop watches), which fails naming the dead
rank and tells the peers; an idle engine tells them at once
(``take_external``, run by the backend when no op runs). Each loss the engine
finds out first goes to the backend (``on_loss``), so the point-to-point side
learns it too. Every rank named is a global rank.
"""

from __future__ import annotations

import logging
import os

from .....runtime import DistBackendError, DistMismatchError, DistNetworkError, DistTimeoutError
from ..wire import _frame as F

__all__ = ["EngineLosses", "abort_reader"]

log = logging.getLogger("ndist.collectives.socket")


class EngineLosses:
    """What one ``CollectiveStreams`` does when its group loses a member, and the state it keeps for
    that: the loss told from elsewhere (``external``), the pipe that wakes a waiting op
    (``wake_r``), the hook to the backend (``on_loss``). ``eng.broken`` stays the
    engine's: every op reads it."""

    def __init__(self, eng) -> None:
        self.eng = eng
        #: called (on the engine's thread) with each loss this engine finds out first:
        #: ``on_loss(global_rank, host, message)`` (the backend's ``GroupFailure.record``)
        self.on_loss = None
        #: a loss another part of the backend learned of (``notify_lost``), taken up by
        #: the engine's own thread: at the next ``begin``, or at once by a waiting op
        self.external: DistNetworkError | None = None
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)

    def notify_lost(self, rank: int, host, message: str) -> None:
        """Another part of the backend (its point-to-point side, or a notice) learned that
        global rank ``rank`` is lost. Any thread: the op waiting now (or the next one)
        fails naming it, and this rank tells its collective peers (ABORT ``lost``)."""
        if self.external is not None or self.eng.broken is not None:
            return
        self.external = DistNetworkError(f"{message}", rank=rank, host=host)
        try:
            os.write(self.wake_w, b"x")
        except OSError:
            pass

    def take_external(self) -> None:
        """On the engine's thread: turn a loss told by ``notify_lost`` into this
        engine's failure, tell every peer (also when idle), and raise it during an op."""
        told = self.external
        if told is None or self.eng.broken is not None:
            if self.eng.broken is not None and self.eng.op is not None:
                raise self.eng.broken
            return
        during = f", during {self.eng.op.desc}" if self.eng.op is not None else ""
        exc = DistNetworkError(f"group {self.eng.group_name!r}: rank {told.rank} ({told.host}) is lost{during}; {told}",
                               rank=told.rank, host=told.host)
        self.eng.broken = exc
        self.announce(exc)
        if self.eng.op is not None:
            raise exc

    def __del__(self):
        # (not at the backend's close: a worker thread that outlived it may still poll)
        for fd in (getattr(self, "wake_r", -1), getattr(self, "wake_w", -1)):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def lost(self, conn, err) -> DistNetworkError:
        what = self.eng.op.desc if self.eng.op is not None else "idle"
        if self.eng.closing:
            exc = DistNetworkError(f"group {self.eng.group_name!r}: backend closed during {what}", rank=conn.grank,
                                   host=conn.host)
            self.eng.broken = exc
            return exc
        exc = DistNetworkError(
            f"group {self.eng.group_name!r}: lost connection to rank {conn.grank} ({conn.host}) during {what}: "
            f"{err or 'connection closed'}", rank=conn.grank, host=conn.host)
        conn.dead = exc
        conn.out.clear()
        first = self.eng.broken is None
        self.eng.broken = exc
        if first:
            if self.eng.op is not None:
                self.announce(exc)
                if not self.eng.acking:  # (an op's data all came: the peer may just have left)
                    self.told_backend(exc, str(exc).split(": ", 1)[1])
        return exc

    def told_backend(self, exc: DistNetworkError, message: str) -> None:
        if self.on_loss is not None and exc.rank is not None:
            try:
                self.on_loss(exc.rank, exc.host, message)
            except Exception as err:  # noqa: BLE001 - diagnostics path: never hide the loss itself
                log.debug("recording the loss of rank %s failed: %s", exc.rank, err)

    def announce(self, exc: DistNetworkError) -> None:
        """Tell every other peer that the group lost rank ``exc.rank``: a survivor may
        be waiting on this rank (for an ACK, or data this rank will now never send)
        without polling the dead rank's connection itself. Best effort, never blocks."""
        msg = str(exc)
        msg = msg.split(": ", 1)[1] if msg.startswith("group ") else msg
        self.eng.tell_peers(F.pack_abort("lost", msg, exc.rank, exc.host), self.eng.op.seq if self.eng.op is not None else 0)


def abort_reader(engine, h, exp):
    def cb(conn, view):
        info = F.unpack_abort(bytes(view))
        if info.get("kind") == "stalled":  # a peer's op timed out (_engine_stall): not a failure of ours
            engine.stalls.on_stall_notice(conn, h.seq, info)
            return
        if info.get("kind") == "lost":
            # a peer lost a rank: the group is broken, whatever op this is about
            engine.unacked.discard(conn.peer)
            dead, host = info.get("rank"), info.get("host")
            what = engine.op.desc if engine.op is not None else "idle"
            exc = DistNetworkError(
                f"group {engine.group_name!r}: rank {dead} ({host}) is lost, during {what}; rank {conn.grank} "
                f"({conn.host}) reported: {info.get('msg')}", rank=dead, host=host)
            if engine.broken is None:
                engine.broken = exc
                if engine.op is not None:
                    engine.losses.announce(exc)
                engine.losses.told_backend(exc, f"rank {conn.grank} ({conn.host}) reported: {info.get('msg')}")
            raise exc
        if h.seq == engine.unacked_seq:
            engine.unacked.discard(conn.peer)
        if exp.kind == -1 and conn.peer not in engine.unacked:
            exp.done = True
        op = engine.op
        if op is None or h.seq != op.seq or exp.kind == -1:
            return  # about an op that already ended here
        msg = f"rank {conn.grank} ({conn.host}) failed {op.name} #{op.seq}: {info.get('msg')}"
        if info.get("kind") == "network":
            raise DistNetworkError(msg, rank=info.get("rank"), host=info.get("host"))
        if info.get("kind") == "timeout":
            raise DistTimeoutError(msg)
        if info.get("kind") == "mismatch":
            raise DistMismatchError(msg)
        raise DistBackendError(msg)
    return cb
