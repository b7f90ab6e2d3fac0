"""What a Work of the socket backend waits on, for its timeout's message
(``Pending``, one per ``SocketBackend``): ``Work.pending`` describes the running op (the native or
Python engine's peers not heard from, or the links still opening), a queued one (how
many ops are ahead, and what the running one waits on or how it failed), and gives the
running op its own deadline and grace to raise its own error first.
"""

from __future__ import annotations

import time

from ....runtime import Work
from .failure._engine_stall import grace_s

__all__ = ["Pending"]


class Pending:
    """What a socket backend's Works wait on: its executor (``ex``, what runs and what is
    queued), its mesh (the links still opening), its group timeout, and the engine that
    runs its collectives once the group is set up (``eng``, the Python engine, and
    ``native``, the native engine's algorithms when the group runs there: the backend
    sets them when it makes them)."""

    def __init__(self, ex, mesh, timeout: float) -> None:
        self.ex = ex
        self.mesh = mesh
        self.timeout = timeout
        self.eng = None
        self.native = None

    def describe(self, work: Work):
        """``work.pending``: a function saying what ``work`` waits on now."""
        def describe() -> str:
            if work.is_completed():
                return "done"
            if self.ex.current is work:
                self._await_own_outcome(work)
                if work.is_completed():
                    return "done"
                if self.native is not None:
                    return self.native.pending()
                return self.eng.pending() if self.eng is not None else self._connecting()
            n = self.ex.ahead(work)
            if n:
                running = self.ex.current
                if running is not None and running.pending is not None and running is not work:
                    ahead = f"; running {running.op} (#{running.seq}): {running.pending()}"
                    failed = running.exception()  # (it may end while pending() looks)
                    if failed is not None:
                        ahead = f"; running {running.op} (#{running.seq}) failed: {failed}"
                else:
                    ahead = self._running_detail()
                return f"queued behind {n} earlier operation{'s' if n > 1 else ''} on this group{ahead}"
            return "starting (nothing is queued before it on this group)"
        return describe

    def _await_own_outcome(self, work: Work) -> None:
        """A wait on ``work`` (the op running now) timed out about when the op's own deadline
        passes (``async_op=False`` waits the group timeout from the call): give the op its
        own timeout and grace (``_engine_stall``) to raise its own error, which names a
        root cause told by a notice (kill trial seed 7213: a blocking op queued behind an
        async one named the rank it waited on)."""
        nat, eng = self.native, self.eng
        if nat is not None:
            own = nat.g.op_start + nat.g.timeout
        elif eng is not None and eng.op is not None:
            own = eng.deadline
        else:
            return
        now = time.monotonic()
        if own - now > 0.5:  # its deadline is not near: a short wait by the caller
            return
        end = min(own + grace_s(self.timeout) + 0.1, now + 2.0)
        while not work.is_completed() and time.monotonic() < end:
            time.sleep(0.005)

    def _running_detail(self) -> str:
        """What the op running now (inline, without a Work) waits on, for a queued op."""
        if self.native is not None:
            return "; " + self.native.pending()
        if self.eng is not None:
            return "; " + self.eng.pending() if self.eng.op is not None else ""
        return "; " + self._connecting()

    def _connecting(self) -> str:
        waiting = self.mesh.connecting
        return "connecting to the group's ranks" + (f"; ranks not heard from: {waiting}" if waiting else "")
