"""The native engine's two-level form, for a group that spans hosts with more than one rank
on some host: shared memory inside each host, one leader per host over TCP.

Each rank holds two compiled groups:

* ``local``: a ``_cnative.Group`` over the group ranks on its host (the same-host engine's
  slots), or None when it is alone on its host;
* ``tcp``: a ``_cnative.TcpGroup`` over every rank's collective link (the direct TCP
  engine). Its ``view`` narrows an op to the leaders (the lowest group rank of each host,
  in host order); the streams, the waits and the failures still count every rank.

``TwoLevelGroup`` has the compiled groups' interface in the group's own numbering (the
methods ``NativeAlgorithms`` calls, ``seq``, ``broken``, ``fail``, ``tell_stalled``, the
stall callbacks), so the algorithms and the backend use it as they use either group. Its
ops run in C (``ctwo.c``'s ``TwoGroup``, ``c``: the steps below, one call with the GIL
released, the same code FastLane and the C interface run); this class keeps the set-up, the
failure mapping (``_failure``, which C calls only when a step failed), the stall callbacks
and the list forms of the direct ops.

Each op, as steps on the two groups (``H`` hosts; every rank of a host runs the same steps):

* ``all_reduce``: a shared-memory reduce to the leader, the leaders' all_reduce, a
  shared-memory broadcast from the leader. Every rank gets the leader's result, so all
  results are bit-identical (the fold order differs from the direct engine's);
* ``broadcast``: on the root's host a shared-memory broadcast from the root, then the
  leaders' broadcast; on the other hosts the leaders' broadcast, then a shared-memory one;
* ``reduce``: as all_reduce's first two steps into a copy on a leader that is not the root
  (a non-root's buffer is never written), then, when the root is not its host's leader, a
  shared-memory scatter that gives the root alone the result;
* ``all_gather``: a shared-memory all_gather of the host's blocks, the leaders' exchange of
  whole host blocks (an uneven all_to_all among them), then shared-memory broadcasts of the
  other hosts' blocks (those before this host's, those after). The blocks go as they lie in
  the output when every host's ranks are consecutive, else through a copy in host order; a
  list of outputs is gathered into one buffer first;

A call smaller than ``two_level_min`` bytes (``NDIST_NATIVE_TWO_LEVEL_MIN``, default 256 KiB;
all_gather: its output, at least ``ALL_GATHER_MIN``) runs direct on the whole TCP group
instead, as does every barrier (unless the minimum is 0): below it the second hop cost
more than the sockets it saved (docs/performance.md in git history, "Two levels across
hosts", 2026-11-27). Every rank decides alike from the
call's size. A call whose size differs between ranks across the minimum runs in different
steps: where a rank that is no leader runs it direct, a leader finds its frame of this call
outside the leaders' view (the ``TcpGroup`` reports a mismatch); else it ends at the group's
timeout, naming the rank not heard from (docs/native.md, "Two levels");
* ``barrier``: shared-memory barrier, the leaders' barrier, shared-memory barrier;
* ``all_to_all``, ``reduce_scatter``, ``gather``, ``scatter``: direct, on the whole TCP
  group (every rank to every rank), as the direct TCP engine runs them.

**Mismatches.** Every step's header carries the call it belongs to in its op code (the
compiled groups' ``tag``: the op and its root above bit 8), so two different calls whose
steps look alike do not pass for one, and a mismatch names the calls.

**Failures.** Any failure breaks the whole group, as on the direct TCP engine (whose one
exception, a direct op's mismatch that leaves every stream in step, keeps it here too): the step that
failed raises its error (renumbered to the group's ranks), and this rank fails its other
group naming the same rank (by global rank), with the same kind: a rank lost (a dead peer,
a connection ended, a rank that failed) or a timeout (``-2 - code``: the peers raise a
``DistTimeoutError`` naming that rank); a mismatch fails it naming no one. So a rank
waiting in the other step, here or on another host, raises at once naming the root cause.
A deadline passing in one step is told to the peers of the other (its notice), as the
process's groups tell each other.
"""

from __future__ import annotations

import os

import numpy as np

from ..wire._links import topology
from ._engine import env_bytes

__all__ = ["TwoLevelGroup", "HOSTS_ENV", "MIN_ENV", "TWO_LEVEL_MIN", "compiled", "host_split", "min_bytes"]

#: testing and benchmarking on one machine: ``k`` (hosts of ``k`` consecutive global ranks) or
#: ``mod:k`` (rank g on host ``g % k``); the native engine then takes that for the hosts
HOSTS_ENV = "NDIST_NATIVE_HOSTS"
#: the smallest call (bytes of its buffer; all_gather: of its whole output) that runs in two
#: levels; a smaller one runs direct on the whole TCP group (docs/performance.md in git history,
#: "Two levels across hosts", 2026-11-27: below it the second hop cost more than the sockets it
#: saved, 2 hosts x 2 ranks on a 2-core VM)
MIN_ENV = "NDIST_NATIVE_TWO_LEVEL_MIN"
TWO_LEVEL_MIN = 256 << 10
#: all_gather's, of its whole output, unless the minimum is 0: at 2 x 2 its two levels took
#: 14% more CPU than the direct form for a 4 MiB output and 27% less for a 64 MiB one
ALL_GATHER_MIN = 64 << 20

_OP = {"all_reduce": 1, "reduce": 2, "broadcast": 3, "all_gather": 4, "gather": 5, "scatter": 6,
       "all_to_all": 7, "reduce_scatter": 8, "barrier": 9}


def host_split(granks) -> tuple | None:
    """``NDIST_NATIVE_HOSTS``: the host index of each group rank (global ranks ``granks``),
    or None when it is not set."""
    raw = os.environ.get(HOSTS_ENV, "").strip().lower()
    if not raw:
        return None
    mod = raw.startswith("mod:")
    try:
        k = int(raw[4:] if mod else raw)
    except ValueError:
        k = 0
    if k < 1:
        raise ValueError(f"{HOSTS_ENV}: expected a rank count k >= 1 or 'mod:k', got {raw!r}")
    return topology(g % k if mod else g // k for g in granks)


def min_bytes() -> int:
    """``NDIST_NATIVE_TWO_LEVEL_MIN`` (bytes; 0: every call in two levels), else ``TWO_LEVEL_MIN``."""
    return env_bytes(MIN_ENV, TWO_LEVEL_MIN, "every call in two levels")


def _u8(a) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


def _in_group(mine, code):
    """A local group's rank code (a local rank, or STALL_GLOBAL + a global rank, or negative)
    in the group's numbering: ``mine`` the group ranks of this host."""
    return mine[code] if isinstance(code, int) and 0 <= code < len(mine) else code


def untag(op: int, root: int) -> tuple:
    """A header's (op, root) as the call it belongs to: a two-level step's tag names the
    call (its op code and root); a header without one is the call itself."""
    if op >> 8:
        return (op >> 8) & 0xFF, (op >> 16) - 1
    return op, root


def compiled(g):
    """The compiled group that runs ``g``'s ops (a NativeAlgorithms' ``g``): a
    ``TwoLevelGroup``'s ``TwoGroup``, else ``g`` itself."""
    return g.c if isinstance(g, TwoLevelGroup) else g


class TwoLevelGroup:
    """One rank's side of a two-level group (see the module's docstring): ``local`` (None
    when alone on its host) and ``tcp`` over ``hosts`` (the host index of each group rank,
    hosts numbered in the order of their lowest rank); ``granks``: the global ranks."""

    def __init__(self, mod, local, tcp, hosts, rank: int, granks, two_level_min: int = TWO_LEVEL_MIN) -> None:
        self.mod = mod
        #: calls below this many bytes run direct on the whole TCP group (``min_bytes``); all_gather's
        #: (its output) at least ``ALL_GATHER_MIN`` unless it is 0
        self.two_level_min = two_level_min
        self.gather_min = max(two_level_min, ALL_GATHER_MIN) if two_level_min else 0
        self.local = local
        self.tcp = tcp
        self.rank = rank
        self.size = len(hosts)
        self.hosts = tuple(hosts)
        self.granks = tuple(granks)
        nh = max(self.hosts) + 1
        self.members = [tuple(r for r in range(self.size) if self.hosts[r] == h) for h in range(nh)]
        self.leaders = tuple(m[0] for m in self.members)
        self.host = self.hosts[rank]
        self.mine = self.members[self.host]
        self.lindex = {r: i for i, r in enumerate(self.mine)}
        self.is_leader = rank == self.mine[0]
        self._on_stall = self._on_deadline = None
        self._warn_after = 0.0
        self._cell = [tcp, local]  # (what the stall callbacks reach: emptied at close)
        #: the ops' steps, in C (ctwo.c); the methods NativeAlgorithms calls are its own
        self.c = mod.TwoGroup(local, tcp, self.hosts, rank, two_level_min, self.gather_min, self._failure)
        sg = mod.STALL_GLOBAL
        lindex, gr, final = self.lindex, self.granks, mod.STALL_FINAL

        def local_code(code: int) -> int:
            """A group rank code (maybe with STALL_FINAL) for the local group: a member's
            local rank, else STALL_GLOBAL + the global rank."""
            if code < 0:
                return code
            fin, base = code & final, code & ~final
            if base < sg:
                base = lindex[base] if base in lindex else sg + gr[base]
            return base | fin

        self._local_code = local_code
        if local is not None:  # (kept until the groups are freed: a wait on another thread reads it)
            local.watch = tcp

    # ---------------------------------------------------------- the compiled groups' attributes
    @property
    def seq(self) -> int:
        return self.tcp.seq

    @seq.setter
    def seq(self, value: int) -> None:
        self.tcp.seq = value
        if self.local is not None:
            self.local.seq = value

    @property
    def broken(self) -> int:
        return int(bool(self.tcp.broken or (self.local is not None and self.local.broken)))

    @property
    def _level(self):
        """The compiled group of the step running (or last run), or None."""
        return (None, self.tcp, self.local)[self.c.level]

    @property
    def op_start(self) -> float:
        g = self._level
        return (g if g is not None else self.tcp).op_start

    @property
    def timeout(self) -> float:
        return self.tcp.timeout

    @property
    def warn_after(self) -> float:
        return self._warn_after

    @warn_after.setter
    def warn_after(self, value: float) -> None:
        self._warn_after = value
        self.tcp.warn_after = value
        if self.local is not None:
            self.local.warn_after = value

    @property
    def on_stall(self):
        return self._on_stall

    @on_stall.setter
    def on_stall(self, cb) -> None:
        """``cb(peer, word, waited, left)``, ``peer`` a group rank (the local group's renumbered)."""
        self._on_stall = cb
        self.tcp.on_stall = cb
        if self.local is not None:
            mine = self.mine
            self.local.on_stall = None if cb is None else (
                lambda peer, word, waited, left: cb(_in_group(mine, peer), word, waited, left))

    @property
    def on_deadline(self):
        return self._on_deadline

    @on_deadline.setter
    def on_deadline(self, cb) -> None:
        """``cb(code)`` (a group rank, or STALL_GLOBAL + a global rank) when a step's deadline
        passes; the other compiled group's peers are told too (this rank is idle there). The
        callbacks reach the groups through ``self._cell``, emptied at ``close``: a compiled
        group is not tracked by the garbage collector, so a callback holding the other group
        would keep both (and their sockets) for the process's life."""
        self._on_deadline = cb
        cell, mine, to_local = self._cell, self.mine, self._local_code

        def from_tcp(code):
            if len(cell) > 1 and cell[1] is not None:
                cell[1].tell_stalled(to_local(code))
            if cb is not None:
                cb(code)

        def from_local(code):
            code = _in_group(mine, code)
            if cell:
                cell[0].tell_stalled(code)
            if cb is not None:
                cb(code)

        self.tcp.on_deadline = from_tcp
        if self.local is not None:
            self.local.on_deadline = from_local

    # ---------------------------------------------------------- numbering
    def _global_code(self, r: int) -> int:
        """A group rank (or STALL_GLOBAL + a global rank) as STALL_GLOBAL + its global rank."""
        return self.mod.STALL_GLOBAL + self.granks[r] if 0 <= r < self.mod.STALL_GLOBAL else r

    # ---------------------------------------------------------- failures
    def fail(self, code: int) -> None:
        """Break both groups naming ``code`` (a group rank, STALL_GLOBAL + a global rank, -1:
        no one; ``-2 - code``: a timeout waiting on ``code``)."""
        self.tcp.fail(code)
        self._fail_local(code)

    def _fail_local(self, code: int) -> None:
        """Break the local group naming ``code`` (as ``fail``'s) in its numbering."""
        if self.local is not None:
            self.local.fail(-2 - self._local_code(-2 - code) if code <= -2 else self._local_code(code))

    def tell_stalled(self, code: int) -> None:
        self.tcp.tell_stalled(code)
        if self.local is not None:
            self.local.tell_stalled(self._local_code(code))

    def close(self) -> None:
        if self.local is not None:
            self.local.close()
            self.local.on_deadline = self.local.on_stall = None
        self.tcp.close()
        self.tcp.on_deadline = self.tcp.on_stall = None
        self._cell.clear()
        self.c.close()

    def waiting(self) -> list:
        """The group ranks the running step has not heard from."""
        g = self._level
        if g is None:
            return []
        if g is self.tcp:
            return list(g.waiting())
        piece, words = g.progress()
        me = self.lindex[self.rank]
        return [self.mine[q] for q, (post, done, _state) in enumerate(words)
                if q != me and (post < 2 * piece or done + 2 < piece)]

    def _spread(self, err, from_local: bool) -> None:
        """A step failed with ``err`` (renumbered): the other group fails too, naming the same rank."""
        kind, peer, cause, detail = err.args
        stalled = kind in ("timeout", "stalled")
        if kind in ("self_failed", "self_closed"):
            return  # (fail() / close() broke both already)
        if kind == "mismatch" and not from_local and not self.tcp.broken:
            return  # (a direct op's mismatch the TcpGroup kept: every stream in step, the group goes on)
        if kind == "mismatch":
            code = -1
        elif kind == "stalled":
            code = self._global_code(cause)
        elif kind == "failed" and isinstance(cause, int) and cause >= 0:
            code = self._global_code(cause)
        elif kind == "abort":
            code = self._global_code(peer)
            why = detail[0] if detail else b""
            stalled = b'"kind": "stalled"' in (why if isinstance(why, bytes) else b"")
        else:  # timeout, dead, lost, closed, failed naming no one
            code = self._global_code(peer)
        if stalled and code >= 0:
            code = -2 - code
        if from_local:
            self.tcp.fail(code)
        else:
            self._fail_local(code)

    def _error(self, err, from_local: bool):
        """``err`` renumbered to the group's ranks, its calls named by their tags."""
        kind, peer, cause, detail = err.args
        if from_local:
            peer, cause = _in_group(self.mine, peer), _in_group(self.mine, cause)
        if kind == "mismatch":
            op, dtype, redop, root, nbytes, seq, esize, sends, wants, prior = detail
            op, root = untag(op, root)
            detail = (op, dtype, redop, root, nbytes, seq, esize, sends, wants, self._untag_prior(prior))
        elif detail and isinstance(detail, tuple) and len(detail) == 3:  # (word, waited, prior)
            detail = (detail[0], detail[1], self._untag_prior(detail[2]))
        return self.mod.Error(kind, peer, cause, detail)

    @staticmethod
    def _untag_prior(prior):
        if prior is None:
            return None
        op, dtype, root, nbytes, seq, esize = prior
        op, root = untag(op, root)
        return (op, dtype, root, nbytes, seq, esize)

    def _failure(self, err, from_local: bool):
        """``TwoGroup``'s failure hook: a step failed on the local group (``from_local``) or the
        TCP group with ``err`` (that group's exception); raise it renumbered to the group's
        ranks, its calls named by their tags, after failing the other group naming the same
        rank. A shared-memory step that ended on the TCP group's news (a peer failed that
        group, or runs this call direct: ``Group.watch``) raises the TCP group's error."""
        mod = self.mod
        if not isinstance(err, mod.Error):  # a signal, NumPy's fallback raised: the step's group is broken
            other = self.tcp if from_local else self.local
            if other is not None:
                other.fail(-1)
            raise err
        if from_local and err.args[0] == "news":
            try:
                self.tcp.raise_news()
            except mod.Error as news:
                err, from_local = news, False
        err = self._error(err, from_local)
        self._spread(err, from_local)
        raise err from None

    def _direct(self, op: str, root: int, method, *args) -> None:
        """A direct op's list form: ``method`` of the whole TCP group, tagged with the call."""
        self.c.direct(_OP[op], root)
        try:
            method(*args)
        except BaseException as err:
            self._failure(err, False)

    # ---------------------------------------------------------- two-level ops (their steps: ``c``'s)
    def all_reduce(self, buf, code, rc, es, fb, rsag) -> None:
        self.c.all_reduce(buf, code, rc, es, fb, rsag)

    def broadcast(self, buf, code, src) -> None:
        self.c.broadcast(buf, code, src)

    def reduce(self, buf, code, rc, es, fb, root) -> None:
        self.c.reduce(buf, code, rc, es, fb, root)

    def barrier(self) -> None:
        self.c.barrier()

    def all_gather(self, outputs, inp, code) -> None:
        if not isinstance(outputs, (list, tuple)):
            self.c.all_gather(outputs, inp, code)
            return
        lens = [o.nbytes for o in outputs]  # (a list's blocks may differ in size)
        whole = np.empty(sum(lens), np.uint8)
        self.c.all_gather(whole, inp, code, lens)
        off = 0
        for o, k in zip(outputs, lens):
            _u8(o)[...] = whole[off:off + k]
            off += k

    # ---------------------------------------------------------- direct ops (the whole TCP group)
    def all_to_all(self, outputs, inputs, code, *counts) -> None:
        self._direct("all_to_all", -1, self.tcp.all_to_all, outputs, inputs, code, *counts)

    def reduce_scatter(self, out, inputs, code, rc, es, fb) -> None:
        self._direct("reduce_scatter", -1, self.tcp.reduce_scatter, out, inputs, code, rc, es, fb)

    def gather(self, outputs, inp, code, dst) -> None:
        self._direct("gather", dst, self.tcp.gather, outputs, inp, code, dst)

    def scatter(self, out, inputs, code, src) -> None:
        self._direct("scatter", src, self.tcp.scatter, out, inputs, code, src)
