"""The failure state of one group (one ``SocketBackend``): the members it lost, the first
loss, and who is told of a loss, in what order.

Every part of the backend that finds a member lost reports it here (``record``), from any
thread: the collective engine (a lost connection, or a ``lost`` notice from a peer), the
point-to-point side (a stream that ended without a bye, or a notice), the native engine
(a dead or failed peer), and the other groups of this process (``_losses.tell_groups``).
The first loss is the group's: ``record`` keeps it (``first``), then tells, in order,

1. ``tell``: the backend's own sides that do not know it yet (its mesh, collective
   engine and point-to-point side; each tells its own peers, ABORT ``lost``, and fails
   what waits, now and later);
2. ``hooks``: what was attached later (the native engine's group);
3. ``spread``: the other groups of this process that have the rank as a member.

A later loss is noted in ``lost`` but tells no one: the group is already broken. A closed
group records nothing (its peers end their streams as it closes).
"""

from __future__ import annotations

import logging
import threading

__all__ = ["GroupFailure"]

log = logging.getLogger("ndist.collectives.socket")


class GroupFailure:
    """One group's failure state: ``lost`` (global rank -> how this rank learned of it),
    ``first`` ((global rank, host, message) of the first loss, or None) and ``closed``."""

    def __init__(self, tell, spread) -> None:
        #: global rank -> the message of its loss, every loss recorded
        self.lost: dict[int, str] = {}
        #: (global rank, host, message) of the first loss recorded; None while whole
        self.first: tuple | None = None
        #: set when the group closes: nothing is recorded after it
        self.closed = False
        #: called with (global rank, host, message) after ``tell``, on the first loss
        #: (e.g. to fail the native group); an exception is logged, not raised
        self.hooks: list = []
        self._tell = tell
        self._spread = spread
        self._lock = threading.Lock()

    def record(self, rank: int, host, message: str) -> None:
        """Global rank ``rank`` (on ``host``) of this group is lost: its process died, or
        its connection failed without a goodbye. ``message`` says how this rank learned
        it (``lost connection to rank 2 (host) during ...``, ``rank 0 (host) reported:
        ...``)."""
        with self._lock:
            if self.closed:
                return
            self.lost.setdefault(rank, message)
            if self.first is not None:
                return
            self.first = (rank, host, message)
        self._tell(rank, host, message)
        for hook in list(self.hooks):
            try:
                hook(rank, host, message)
            except Exception as err:  # noqa: BLE001 - the loss is recorded; a hook must not hide it
                log.debug("a loss hook failed: %s", err)
        self._spread(rank, host, message)
