"""The collective links of the engine (``_engine.Engine``): opened on first use.

No link opens when the group is set up. ``Engine.conns`` holds the links open so far;
a peer missing there is linked when a step first names it (``Conns.__missing__``),
or with ``open_links`` where an op must have several before its first frame (every
peer of a direct exchange, a schedule round's peers, the pairs of an all_to_all that
must agree on their paths). ``opener`` (``Mesh.collective_link``) opens the socket and
says what the pair agreed (``wire/_link_facts.Facts``); ``on_link`` (``_links.attach``)
wires the rings and CMA. A peer known dead fails the opening at once, naming it: the
group is then broken, as after a lost connection (``_engine_loss``).
"""

from __future__ import annotations

import time

from .....runtime import DistNetworkError

__all__ = ["Conns", "LinkHandling"]


class Conns(dict):
    """peer -> ``_Conn`` of the links open so far; a peer not here yet is linked on
    first use (``Engine.open``): a step to it, or ``open_links``."""

    __slots__ = ("eng",)

    def __missing__(self, peer):
        return self.eng.open(peer)


class LinkHandling:
    """The link half of ``Engine`` (a mixin: it uses the engine's streams and state)."""

    def open(self, peer: int):
        """Open the collective link to ``peer`` (its first use; ``Conns``). A peer known
        dead fails it at once, as a lost connection does: the group is broken."""
        if self.opener is None or peer == self.rank or not 0 <= peer < self.size:
            raise KeyError(peer)
        if self.broken is not None:
            raise self.broken
        deadline = self.deadline if self.op is not None else time.monotonic() + 60.0
        try:
            sock, facts = self.opener(peer, deadline)
        except DistNetworkError as err:
            if err.rank is not None and self.broken is None and getattr(err, "dead", False):
                self.broken = err
                if self.op is not None:
                    self._announce(err)
                self._told_backend(err, str(err).split(": ", 1)[-1])
            raise
        conn = self.new_conn(peer, self.hosts.get(peer, "?"), sock, self.granks[peer])
        try:
            if self.on_link is not None:
                self.on_link(conn, facts)
        except BaseException:
            sock.close()
            raise
        dict.__setitem__(self.conns, peer, conn)
        self._by_fd[conn.fd] = conn
        return conn

    def open_links(self, peers) -> None:
        """Open the links to every peer in ``peers`` not linked yet (an op that talks to
        all of them, and must agree per pair on their paths before its first frame)."""
        conns = self.conns
        if len(conns) == self.size - 1:
            return
        for p in peers:
            if p not in conns:
                self.open(p)
