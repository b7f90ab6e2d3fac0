"""SocketBackend: the default CPU backend (TCP full mesh + shared memory)."""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time

import numpy as np

from ....runtime import BackendContext, DistNetworkError, Work
from ....runtime import _net
from ..._backend import DONE, Backend
from ..._reduce_op import ReduceOp
from . import _cma
from . import _frame as F
from ._algorithms import CHUNK, Algorithms
from ._engine import Engine, OpInfo
from ._executor import Executor
from ._p2p import P2P
from ._reduce import check_op, finalize
from . import _ring
from ._shm import OwnSegment, PeerSegments, job_prefix, sweep_dead, unlink_prefix
from ._tcp import Mesh
from ._work import SocketWork

__all__ = ["SocketBackend", "TRANSPORT_ENV", "SHM_MIN"]

log = logging.getLogger("ndist.collectives.socket")

TRANSPORT_ENV = "NDIST_TRANSPORT"
#: payloads to a same-host peer at least this large go through shared memory
#: (``NDIST_TRANSPORT=shm``: every non-empty payload).
SHM_MIN = 32 << 10
_instances = itertools.count()



def _transport_mode(options) -> str:
    mode = getattr(options, "transport", None) or os.environ.get(TRANSPORT_ENV, "auto")
    mode = str(mode).lower()
    if mode not in ("auto", "tcp", "shm"):
        raise ValueError(f"{TRANSPORT_ENV}: expected 'tcp', 'shm' or 'auto', got {mode!r}")
    return mode


def info_has_cma(info: dict) -> bool:
    return info.get("transport") == "auto" and info.get("cma") is not None


def _trivial(op: str, blocking: bool, outputs=None) -> Work:
    """A one-rank group's op, already done here: the shared DONE for a blocking call."""
    return DONE if blocking else Work.completed(op, -1, outputs)


def _u8(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


class SocketBackend(Algorithms, Backend):
    """Gloo-style backend: full TCP mesh, shared-memory payloads between ranks on one host.

    Collectives run in issue order, inline on the caller's thread when it
    will wait and nothing is queued (``blocking=True``), else on one worker
    thread. Point-to-point messages use their own streams and reader thread,
    so they never queue behind, or deadlock with, collectives or each other.
    """

    name = "socket"
    blocking_calls = True

    def __init__(self, ctx: BackendContext) -> None:
        super().__init__(ctx)
        if not 0 <= ctx.rank < ctx.size:
            raise ValueError(f"rank: expected 0 <= rank < size={ctx.size}, got {ctx.rank}")
        self._timeout = ctx.timeout.total_seconds()
        self._peer_list = tuple(p for p in range(ctx.size) if p != ctx.rank)
        self._mode = _transport_mode(ctx.options)
        self._shm_min = 1 if self._mode == "shm" else SHM_MIN
        secret = _net.job_secret()
        self._prefix = f"{job_prefix(secret, ctx.group_name)}-r{ctx.rank}-p{os.getpid()}-i{next(_instances)}"
        self._seg = OwnSegment(self._prefix)
        if self._mode != "tcp":
            n = sweep_dead(job_prefix(secret))
            if n:
                log.info("unlinked %d shared-memory segment(s) left by dead processes of this job", n)
        self._peer_segs = PeerSegments()
        # shared-memory rings for the collective streams of same-host pairs (x86-64)
        cap = _ring.capacity_from_env(ctx.size) if self._mode != "tcp" and _ring.available() else 0
        self._rings = None
        if cap and ctx.size > 1:
            try:
                self._rings = _ring.RingFile(_ring.path_for(self._prefix), ctx.size, cap, create=True)
            except OSError as err:  # e.g. /dev/shm full: the sockets carry everything
                log.warning("no shared-memory rings (%s); collectives use the sockets only", err)
        self._seq = 0
        self._seq_lock = threading.Lock()
        self._eng: Engine | None = None
        self._shm_peers: dict[int, bool] = {}
        self._pipeline = False
        self._cma_to: set = set()  # peers that read our buffers directly (process_vm_readv)
        self._chunk = 1 << 62
        self._closed = False
        self._exec = Executor(f"socket[{ctx.group_name}:{ctx.rank}]")
        self._p2p_exec = Executor(f"socket-p2p[{ctx.group_name}:{ctx.rank}]")
        self._p2p = P2P(ctx.rank, ctx.size, ctx.group_name, self._timeout, lambda: self._mesh, self._p2p_exec)
        self._mesh = Mesh(ctx.store, ctx.rank, ctx.size, ctx.group_name, secret, self._timeout,
                          {"shm": self._prefix, "transport": self._mode, "ncpu": os.cpu_count() or 1,
                           "cma": _cma.probe_info() if self._mode == "auto" else None,
                           "ring": self._rings.capacity if self._rings is not None else 0},
                          on_p2p=self._p2p.incoming)

    # ------------------------------------------------------------ plumbing
    def _shm_for(self, peer: int, nbytes: int) -> bool:
        return nbytes >= self._shm_min and self._shm_peers.get(peer, False)

    def _engine(self) -> Engine:
        if self._eng is None:
            socks = self._mesh.collective_sockets(time.monotonic() + self._timeout)
            hosts = {p: self._mesh.host_of(p) for p in socks}
            prefixes = {}
            for p in socks:
                info = self._mesh.peer(p)
                prefixes[p] = info["shm"]
                self._shm_peers[p] = self._mode != "tcp" and info["hostid"] == self._mesh.hostid
            spin = self.size <= (os.cpu_count() or 1)
            # Pipelining pays when every rank has a core and shares the cache; every
            # rank computes this from the same published facts, so all agree.
            infos = [self._mesh.info] + [self._mesh.peer(p) for p in socks]
            self._pipeline = (all(i["hostid"] == self._mesh.hostid for i in infos)
                              and all(self.size <= i.get("ncpu", 1) for i in infos))
            self._chunk = CHUNK if self._pipeline else 1 << 62
            eng = Engine(self.rank, self.size, self.ctx.group_name, socks, hosts, prefixes,
                         self._peer_segs, self._seg, spin)
            self._setup_cma(eng)
            self._setup_rings(eng)
            self._eng = eng
        return self._eng

    def _setup_rings(self, eng: Engine) -> None:
        """Same-host pairs where both ranks offer rings exchange frames through them
        (both sides decide from the same published facts)."""
        if self._rings is None:
            return
        used = []
        for p, conn in eng.conns.items():
            info = self._mesh.peer(p)
            cap = int(info.get("ring") or 0)
            if not cap or not self._shm_peers.get(p):
                continue
            try:
                theirs = _ring.RingFile(_ring.path_for(info["shm"]), self.size, cap, create=False)
            except (OSError, ValueError) as err:
                raise DistNetworkError(f"group {self.ctx.group_name!r}: cannot map rank {p}'s shared-memory "
                                       f"rings: {err}", rank=p, host=self._mesh.host_of(p)) from None
            conn.ring_out = self._rings.ring(p)
            conn.ring_in = theirs.ring(self.rank)
            used.append(p)
        if used:
            log.debug("rank %d: shared-memory rings with ranks %s", self.rank, used)

    def _setup_cma(self, eng: Engine) -> None:
        """Probe which same-host peers' memory we can read; learn who can read ours.

        Only in ``auto`` mode (``shm`` / ``tcp`` keep their single path). Both sides
        of a pair must agree, so each rank publishes what it can read and a sender
        names its buffer only to peers that said they can read it.
        """
        if self._mode != "auto" or self._mesh.info.get("cma") is None:
            return
        same = [p for p in eng.conns if self._shm_peers.get(p)]
        for p in same:
            info = self._mesh.peer(p)
            if _cma.can_read(int(info["pid"]), info.get("cma")):
                eng.cma_pids[p] = int(info["pid"])
        store = self.ctx.store
        store.set(f"sock/cma/{self.rank}", ",".join(map(str, sorted(eng.cma_pids))).encode())
        for p in same:
            if info_has_cma(self._mesh.peer(p)):
                readable = store.get(f"sock/cma/{p}").decode()
                if str(self.rank) in readable.split(","):
                    self._cma_to.add(p)
        if same:
            log.debug("rank %d reads peers %s directly; peers %s read ours", self.rank, sorted(eng.cma_pids),
                      sorted(self._cma_to))

    def _pending(self, work: Work):
        def describe() -> str:
            if work.is_completed():
                return "done"
            if self._exec.current is work:
                return self._eng.pending() if self._eng is not None else "connecting to the group's ranks"
            n = self._exec.ahead(work)
            if n:
                return f"queued behind {n} earlier operation{'s' if n > 1 else ''} on this group"
            return "starting (nothing is queued before it on this group)"
        return describe

    def _submit(self, name: str, arr, count: int, root, body, blocking: bool, outputs=None, redop=None) -> Work:
        with self._seq_lock:
            self._seq += 1
            seq = self._seq
        dcode = F.dtype_code(arr.dtype) if arr is not None else 0
        root_v = -1 if root is None else root

        def job():
            eng = self._eng or self._engine()
            eng.begin(OpInfo(name, dcode, count, root_v, seq, self.rank, F.redop_code(redop)), self._timeout)
            try:
                body()
                eng.finish()
            except BaseException as err:
                eng.fail(err)
                if isinstance(err, DistNetworkError) and err.rank is not None and err.rank in self._shm_peers:
                    self._peer_died(err.rank)
                raise

        if self._closed:
            work = SocketWork(name, seq, outputs)
            work._fail(DistNetworkError(f"{self!r} is closed"))
            return work
        # a blocking call on an idle group runs on this thread and returns the shared
        # DONE (no Work, no Future): its errors propagate from here
        if blocking and self._exec.run_inline(job):
            return DONE
        work = SocketWork(name, seq, outputs)
        work._pending = self._pending(work)
        return self._exec.submit(work, job, blocking)

    def _peer_died(self, peer: int) -> None:
        try:
            prefix = self._mesh.peer(peer)["shm"]
        except Exception:  # noqa: BLE001
            return
        n = unlink_prefix(prefix)
        self._peer_segs.drop(peer)
        if n:
            log.info("unlinked %d shared-memory segment(s) of dead rank %d", n, peer)

    def _root(self, name: str, value: int) -> int:
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or not 0 <= value < self.size:
            raise ValueError(f"{name}: expected a group rank in [0, {self.size}), got {value!r}")
        return int(value)

    def _list(self, name: str, arrays, ref=None) -> list:
        if arrays is None or len(arrays) != self.size:
            raise ValueError(f"{name}: expected a list of {self.size} arrays (one per rank), got "
                             f"{None if arrays is None else len(arrays)}")
        if ref is not None:
            for i, a in enumerate(arrays):
                if a.dtype != ref.dtype:
                    raise TypeError(f"{name}[{i}]: expected dtype {ref.dtype}, got {a.dtype}")
        return list(arrays)

    # ------------------------------------------------------------ reductions
    def all_reduce(self, buf, op=ReduceOp.SUM, scale=None, *, blocking=False) -> Work:
        check_op(buf.dtype, op, scale)
        if self.size == 1:
            finalize(buf, op, scale, 1)
            return _trivial("all_reduce", blocking, [buf])
        return self._submit("all_reduce", buf, buf.size, None,
                            lambda: self._do_all_reduce(buf, op, scale), blocking, [buf], op)

    def reduce(self, buf, dst, op=ReduceOp.SUM, scale=None, *, blocking=False) -> Work:
        check_op(buf.dtype, op, scale)
        dst = self._root("dst", dst)

        def body():
            self._direct_reduce(buf, op, scale, root=dst)
        if self.size == 1:
            finalize(buf, op, scale, 1)
            return _trivial("reduce", blocking, [buf])
        return self._submit("reduce", buf, buf.size, dst, body, blocking, [buf], op)

    def reduce_scatter(self, out, inputs, op=ReduceOp.SUM, scale=None, *, blocking=False) -> Work:
        check_op(out.dtype, op, scale)
        inputs = self._list("inputs", inputs, out)
        if inputs[self.rank].size != out.size:
            raise ValueError(f"inputs[{self.rank}]: expected {out.size} elements (the size of out), "
                             f"got {inputs[self.rank].size}")
        if self.size == 1:
            np.copyto(_u8(out), _u8(inputs[0]))
            finalize(out, op, scale, 1)
            return _trivial("reduce_scatter", blocking, [out])
        return self._submit("reduce_scatter", out, out.size, None,
                            lambda: self._do_reduce_scatter(out, inputs, op, scale), blocking, [out], op)

    # ------------------------------------------------------------ movement
    def broadcast(self, buf, src, *, blocking=False) -> Work:
        src = self._root("src", src)
        if self.size == 1:
            return _trivial("broadcast", blocking, [buf])
        return self._submit("broadcast", buf, buf.size, src, lambda: self._do_broadcast(buf, src), blocking,
                            [buf])

    def all_gather(self, outputs, inp, *, blocking=False) -> Work:
        outputs = self._list("outputs", outputs, inp)
        if outputs[self.rank].nbytes != inp.nbytes:
            raise ValueError(f"outputs[{self.rank}]: expected {inp.size} elements (the size of this rank's "
                             f"input), got {outputs[self.rank].size}")
        return self._submit("all_gather", inp, inp.size, None, lambda: self._do_all_gather(outputs, inp),
                            blocking, outputs)

    def gather(self, outputs, inp, dst, *, blocking=False) -> Work:
        dst = self._root("dst", dst)
        if self.rank == dst:
            outputs = self._list("outputs", outputs, inp)
            if outputs[dst].nbytes != inp.nbytes:
                raise ValueError(f"outputs[{dst}]: expected {inp.size} elements, got {outputs[dst].size}")
        return self._submit("gather", inp, inp.size, dst, lambda: self._do_gather(outputs, inp, dst), blocking,
                            outputs if self.rank == dst else [])

    def scatter(self, out, inputs, src, *, blocking=False) -> Work:
        src = self._root("src", src)
        if self.rank == src:
            inputs = self._list("inputs", inputs, out)
            if inputs[src].nbytes != out.nbytes:
                raise ValueError(f"inputs[{src}]: expected {out.size} elements, got {inputs[src].size}")
        return self._submit("scatter", out, out.size, src, lambda: self._do_scatter(out, inputs, src), blocking,
                            [out])

    def all_to_all(self, outputs, inputs, *, blocking=False) -> Work:
        outputs = self._list("outputs", outputs)
        inputs = self._list("inputs", inputs)
        if outputs[self.rank].nbytes != inputs[self.rank].nbytes:
            raise ValueError(f"outputs[{self.rank}]: expected {inputs[self.rank].nbytes} bytes (this rank's "
                             f"inputs[{self.rank}]), got {outputs[self.rank].nbytes}")
        ref = inputs[0] if inputs else None
        count = sum(a.size for a in inputs)
        return self._submit("all_to_all", ref, count, None, lambda: self._do_all_to_all(outputs, inputs),
                            blocking, outputs)

    def barrier(self, *, blocking=False) -> Work:
        if self.size == 1:
            return _trivial("barrier", blocking)
        return self._submit("barrier", None, 0, None, self._do_barrier, blocking)

    # ------------------------------------------------------------ point to point
    def send(self, buf, dst, tag=0, *, blocking=False) -> Work:
        dst = self._root("dst", dst)
        tag = int(tag)
        work = Work("send", -1, [])
        if self._closed:
            work._fail(DistNetworkError(f"{self!r} is closed", rank=dst))
            return work
        return self._p2p_exec.submit(work, lambda: self._p2p.send(buf, dst, tag), blocking)

    def recv(self, buf, src=None, tag=0, *, blocking=False) -> Work:
        if src is not None:
            src = self._root("src", src)
        work = Work("recv", -1, None)
        if self._closed:
            work._fail(DistNetworkError(f"{self!r} is closed", rank=src))
            return work
        self._p2p.post(buf, src, int(tag), work)
        return work

    # ------------------------------------------------------------ lifetime
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._p2p.flush()  # what this rank sent is read before its connections close
        ex = self._exec
        if self._eng is not None and not ex._busy and not ex._queue:
            # a peer may not have mapped our segment yet for the last op
            self._eng.drain_acks(min(self._timeout, 10.0))
        conns = []
        if self._eng is not None:
            self._eng.closing = True
            conns = list(self._eng.conns.values())
        for c in conns:  # wakes an op blocked in poll: it fails instead of waiting
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._mesh.close()
        self._exec.close("backend closed")
        self._p2p_exec.close("backend closed")
        self._p2p.close()
        for c in conns:
            c.sock.close()
        self._seg.close()
        if self._rings is not None:
            self._rings.unlink()
        self._peer_segs.clear()

    def __del__(self):
        try:
            if not self._closed:
                self._seg.close()
                if self._rings is not None:
                    self._rings.unlink()
        except Exception:  # noqa: BLE001
            pass
