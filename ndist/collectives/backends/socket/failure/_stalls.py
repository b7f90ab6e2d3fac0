"""Timeout notices across a process's groups and point-to-point waits.

A rank whose wait passes its deadline tells the peers of that group which ranks it
had not heard from (``_engine_stall``; the native engine's notice words), and a rank
whose own deadline passes while it waits on such a peer names the peer's root cause.
A rank is often awaited elsewhere than where it is stuck: rank 0 waits on rank 1 in
the world while rank 1 waits on the stopped rank 2 in a subgroup, or in a receive
from it. So a deadline that passes anywhere in this process (a collective of one
group, either engine, or a point-to-point receive) is told by every group of the
process (``tell``):

* the collective side of each other group, when it is idle (a busy one times out on
  its own and tells its peers then): the Python engine sends ABORT ``stalled``
  tagged with the sequence number of its next op, the native engine posts its notice
  words naming the global rank; either is dropped as soon as this rank goes on there;
* the point-to-point streams of every group (ABORT ``stalled``; dropped by the reader
  at this rank's next message).

The rules of the receiving side stay those of one group: a notice counts only once
the waiter's own deadline has passed, only from a rank it still waits on, and only
until that rank goes on; a healthy op is never failed by one.
"""

from __future__ import annotations

import logging
import time

from .....runtime import DistTimeoutError
from . import _losses
from ._engine_stall import grace_s

__all__ = ["tell", "timed_out", "explain_wait", "root_of"]

log = logging.getLogger("ndist.collectives.socket")


def tell(source, ranks, engine: bool = True, final: bool = False) -> None:
    """``source``'s rank (a SocketBackend) passed a deadline waiting on global ``ranks``
    (``final``: it raised naming them; else a first notice, see ``_engine_stall``): every
    group of this process tells its peers (``source``'s own collective side too unless
    ``engine`` is False: it told them already). Any thread; never blocks."""
    ranks = sorted({int(r) for r in ranks})
    if not ranks:
        return
    for b in _losses.groups_of(source):
        try:
            b.tell_stalled(ranks, engine or b is not source, final)
        except Exception as err:  # noqa: BLE001 - a notice is best effort: never hide the timeout
            log.debug("telling group %r of a stall failed: %s", getattr(b, "ctx", None), err)


def explain_wait(source, granks, timeout: float) -> str:
    """A wait of group ``source`` (a SocketBackend) in the store, for what members
    ``granks`` (global) publish in its set-up, timed out: a member stuck elsewhere with a
    stopped rank never publishes (kill trial seed 2029). The words naming the root cause
    a timeout notice from one of them told this process's point-to-point side (waiting a
    grace for one), else naming ``granks``. The process's groups tell their peers a first
    notice at once (naming ``granks``) and a final one at the end."""
    end = time.monotonic() + grace_s(timeout)
    tell(source, granks, True)  # a first notice at once: a survivor waiting on this rank names them
    while True:
        for g in granks:
            root = root_of(source, g)
            if root:
                tell(source, root, True, True)
                return f"; ranks not heard from: {root} (rank {g} waited on {'it' if len(root) == 1 else 'them'})"
        if time.monotonic() >= end:
            break
        time.sleep(0.02)
    tell(source, granks, True, True)
    return f"; ranks not heard from: {sorted(granks)}"


def root_of(source, grank: int) -> list:
    """The global ranks a timeout notice from global rank ``grank`` names (this rank left
    out), as heard by the point-to-point side of any group of ``source``'s process (read
    as notices come, unlike an idle engine's); [] when none."""
    for b in _losses.groups_of(source):
        root = b.notice_of(grank)
        if root:
            return root
    return []


def timed_out(err) -> bool:
    """``err`` (connecting to a peer) is a timeout: the peer accepted but never answered
    the handshake (stopped, say), not a refusal or a reset: not a lost peer."""
    return isinstance(err, (DistTimeoutError, TimeoutError)) or isinstance(getattr(err, "__cause__", None),
                                                                          TimeoutError)
