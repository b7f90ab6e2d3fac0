"""The shrink and notice scenarios of tests/reliability/ and their torch twins in
tests/torch_backend/: each scenario is one rank body, run on ndist's own API (``"ndist"``:
``ndist.distributed`` on backend "socket") or on torch's (``"torch"``: ``torch.distributed``
on backend "ndist", joined through ``ndist://`` on the store ``run_ranks`` hosts), and one
check of what its ranks returned. The test files hold the parameters and the story.

A rank body takes ``(rank, size, api, ...)`` with ``api`` the API's name, and builds its
``Api`` itself (torch is imported only in a torch run)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
import types
from datetime import timedelta

from ndist.testing import run_ranks
from tests.kill_sync import all_past

class Api:
    """The calls the scenarios make, on ``ndist.distributed`` or on ``torch.distributed``
    (whose functions have the same names)."""

    def __init__(self, name: str) -> None:
        self.name, self.torch = name, name == "torch"
        if self.torch:
            import torch
            import torch.distributed as dist

            import ndist.torch  # noqa: F401 - registers backend "ndist"

            torch.set_num_threads(1)
            self.lib = torch
        else:
            import numpy

            import ndist.distributed as dist

            self.lib = numpy
        self.dist = dist
        #: what an op raises once its group knows the loss (torch wraps ndist's in its own)
        self.RankFailure = dist.DistNetworkError if self.torch else dist.DistRankFailureError
        #: what a scenario records of an op's failure (the torch jobs took any exception)
        self.Error = Exception if self.torch else dist.DistError

    def init(self, timeout: float) -> None:
        if self.torch:
            self.dist.init_process_group("ndist", init_method="ndist://", timeout=timedelta(seconds=timeout))
        else:
            self.dist.init_process_group("socket", timeout=timedelta(seconds=timeout))

    @contextlib.contextmanager
    def joined(self, timeout: float):
        """In the job's default group (group timeout ``timeout`` seconds), destroyed at the end."""
        self.init(timeout)
        try:
            yield self.dist
        finally:
            self.dist.destroy_process_group()

    @property
    def store(self):
        """The job's store (this API's form of it)."""
        if self.torch:
            return self.dist.distributed_c10d._get_default_store()
        from ndist.runtime._world import _world

        return _world.job_store

    def ndist_group(self):
        """ndist's ProcessGroup behind the default group."""
        if self.torch:  # (the Python group under either torch backend, compiled or Python)
            from ndist.torch._compiled import python_group

            return python_group(self.dist.distributed_c10d._get_default_group()).ndist_group
        from ndist.runtime._world import _world

        return _world.default

    def watch(self):
        """The job's member watch: torch's (``ndist/torch/_watch.py``) or ndist's."""
        if self.torch:
            from ndist.torch import _watch

            return _watch._job.watch
        from ndist.runtime._world import _world

        return _world.watch

    def watch_lost(self):
        """The job ranks the member watch saw go."""
        if self.torch:
            from ndist.torch import _watch

            return _watch._job.lost
        from ndist.runtime._world import _world

        return _world.lost

    def failed_ranks(self) -> list:
        if self.torch:
            import ndist.torch

            return ndist.torch.get_failed_ranks()
        return self.dist.get_failed_ranks()

    def ones(self, n: int):
        return self.lib.ones(n, dtype=self.lib.float32)

    def full(self, n: int, value: float):
        return self.lib.full((n,), float(value), dtype=self.lib.float32)

    def describe(self, err: BaseException) -> dict:
        """An op's error: ``type``; ``kind``, ndist's error (torch's DistNetworkError wraps it:
        its ``__cause__``); ``failed`` (``failed_ranks``), ``rank`` and ``msg``."""
        kind = err if not self.torch or err.__cause__ is None else err.__cause__
        return {"type": type(err).__name__, "kind": type(kind).__name__, "failed": getattr(err, "failed_ranks", None),
                "rank": getattr(err, "rank", None), "msg": str(err)}

    def attempt(self, op) -> dict | str:
        """``op()``: "no error", or its error (``describe``)."""
        try:
            op()
            return "no error"
        except self.Error as err:
            return self.describe(err)

    def timed(self, out: dict, op) -> None:
        """``out["sub"]``: ``attempt(op)``; ``out["took"]``: how long it took."""
        t0 = time.monotonic()
        out["sub"] = self.attempt(op)
        out["took"] = time.monotonic() - t0

    def until_loss(self, x) -> dict:
        """All-reduce ``x`` until the group knows a loss: the error (``describe``)."""
        try:
            while True:
                self.dist.all_reduce(x)
        except self.RankFailure as err:
            return self.describe(err)

    def shrink_and_sum(self, rank: int, exclude=None, out: dict | None = None) -> dict:
        """``shrink_group(exclude)``, then an all_reduce of ``rank + 1`` on the new default
        group: ``out`` with ``size``, ``rank`` (the new one), ``sum``, ``shrink`` (the shrink's
        seconds) and ``shrink_sum`` (the shrink's and the sum's)."""
        out = {} if out is None else out
        t0 = time.monotonic()
        self.dist.shrink_group(exclude)
        out["shrink"] = time.monotonic() - t0
        y = self.full(4, rank + 1)
        self.dist.all_reduce(y)
        out.update(size=self.dist.get_world_size(), rank=self.dist.get_rank(), sum=float(y[0]),
                   shrink_sum=time.monotonic() - t0)
        return out

    def finish(self, rank: int, out: dict, exclude=None) -> dict:
        """``shrink_and_sum`` into ``out``, then a barrier on the new group: ``out``."""
        self.shrink_and_sum(rank, exclude, out)
        self.dist.barrier()
        return out


def wait_for(cond, what: str, timeout: float = 30.0) -> None:
    """Until ``cond()``; an AssertionError saying ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def run(body, api: str, n: int, *args, victims, transport=None, engine=None, timeout: float = 90):
    """``body(rank, n, api, *args)`` on ``n`` fresh ranks (``init=False``: the body joins);
    ``victims`` die."""
    return run_ranks(body, n, args=(api, *args), init=False, timeout=timeout, may_die=victims, transport=transport,
                     env={"NDIST_ENGINE": engine} if engine else None)


def check_survivors(res, survivors, size: int, total: float, renumbered=None) -> None:
    """Every survivor ends in one group of ``size`` whose sum is ``total``; ``renumbered``:
    old rank -> new rank (None: their ranks stay)."""
    for rank in survivors:
        r = res[rank]
        new = rank if renumbered is None else renumbered[rank]
        assert r["size"] == size and r["rank"] == new and r["sum"] == total, (rank, r)


# ------------------------------------------------ a group made after a member's shrink notice
def group_after_notice(rank, size, api, make, folder):
    """3 ranks: rank 2 dies; rank 0 sees it and shrinks; rank 1 makes a group with rank 0
    (``make``: "new_group" or "split_group") after rank 0's notice came, and runs an op on it."""
    api = Api(api)
    dist = api.dist
    with api.joined(10.0):
        store = api.store
        dist.barrier()
        all_past(folder, rank, 3, victim=2)
        if rank == 2:
            die()
        out = {}
        # (ndist: the default group knows it; torch: the job's member watch saw it go)
        wait_for(lambda: 2 in (api.watch_lost() if api.torch else dist.get_failed_ranks()),
                 "rank 2's loss was never seen")
        if rank == 0:
            store.set("notice/shrinking", "1")
        else:
            store.wait(["notice/shrinking"])
            time.sleep(1.0)  # rank 0's notice (on the member watch) came meanwhile
            g = dist.new_group([0, 1]) if make == "new_group" else dist.split_group(split_ranks=[[0, 1]])
            api.timed(out, lambda: dist.all_reduce(api.ones(4), group=g))
        return api.finish(rank, out, [2] if api.torch else None)  # (torch's takes a list: no None)


def check_group_after_notice(res) -> None:
    assert res[2] is None
    sub = res[1]["sub"]
    assert sub["kind"] == "DistRankFailureError" and sub["rank"] == 2, res[1]
    assert "rank 0" in sub["msg"] and "shrink_group" in sub["msg"], sub["msg"]
    assert res[1]["took"] < 3.0, res[1]  # (the group timeout is 10 s)
    check_survivors(res, (0, 1), 2, 3.0)


# ---------------------------------------- a member suspected lost that calls shrink_group is kept
def keeps_suspected(rank, size, api, asked):
    """4 ranks over TCP: rank 0 resets its collective link to rank 1, rank 1's next op records
    rank 0 lost, then rank 3 dies; every survivor shrinks (torch: with ``asked``, "3" for
    ``[3]`` or "get_failed_ranks"; ndist: ``shrink_group()``)."""
    api = Api(api)
    dist = api.dist
    with api.joined(30.0):
        store = api.store
        g = api.ndist_group()
        out = api.lib.empty(4, dtype=api.lib.float32)
        dist.all_to_all_single(out, api.lib.arange(4, dtype=api.lib.float32))  # every pair linked
        if rank == 0:
            g.backend_for("cpu")._eng.conns[1].sock.shutdown(socket.SHUT_RDWR)
            store.set("suspect/reset", "1")
        if rank == 1:
            store.wait(["suspect/reset"])
        if rank == 3:
            store.wait(["suspect/suspected"])
            die()
        got = api.attempt(lambda: dist.all_reduce(api.ones(4)))
        if rank == 1:
            store.set("suspect/suspected", "1")
        wait_for(lambda: 3 in api.watch_lost(), "rank 3's loss was never told")
        rec = {"got": got, "recorded": g.failed_ranks(), "failed": api.failed_ranks()}
        rec["asked"] = None if not api.torch else [3] if asked == "3" else api.failed_ranks()
        try:
            api.shrink_and_sum(rank, rec["asked"], rec)
        except ValueError as err:
            rec["refused"] = str(err)
        return rec


def check_keeps_suspected(res, api) -> None:
    assert res[3] is None
    got = res[1]["got"]
    assert (got["kind"], got["failed"]) == ("DistRankFailureError", [0]), res  # rank 1 did take rank 0 for lost
    if api == "torch":  # get_failed_ranks names only the rank whose process ended
        assert (res[1]["recorded"], res[1]["asked"]) == ([0, 3], [3]), res[1]
    for rank in (0, 1, 2):
        assert "refused" not in res[rank], (rank, res[rank])
    check_survivors(res, (0, 1, 2), 3, 6.0)


# ------------------------------------------------- a shrink told by a loss only a subgroup knows
def told_by_any_group(rank, size, api, hold_s):
    """4 ranks, subgroups [0, 1] and [1, 2, 3]: rank 0 waits in [0, 1]'s first op; rank 2
    dies; ranks 1 and 3 learn of it in [1, 2, 3] and shrink; rank 1's watch is held back
    ``hold_s`` seconds after it learnt of the loss (torch: the subgroup backend's telling of
    its other groups too)."""
    api = Api(api)
    dist = api.dist
    with api.joined(10.0):
        store = api.store
        sub01 = dist.new_group([0, 1])
        sub123 = dist.new_group([1, 2, 3])
        x = api.ones(4)
        out = {}
        if rank in (1, 2, 3):
            dist.all_reduce(x, group=sub123)  # the subgroup's links exist
        if rank == 1:  # the watch's thread is held back from telling the loss
            learnt = threading.Event()
            if api.torch:
                _hold_torch_tellers(api, sub123, learnt, hold_s)
            else:
                _hold_numbering(learnt, hold_s)
            store.set("anyloss/held", "1")
        if rank == 2:
            store.wait(["anyloss/held", "anyloss/waiting"])
            time.sleep(0.3)  # rank 0 is in the subgroup's set-up by now
            store.set("anyloss/killed", repr(time.time()))
            die()
        if rank == 0:  # waits in [0, 1] for rank 1's address; rank 1 never joins
            store.set("anyloss/waiting", "1")
            out["sub"] = api.attempt(lambda: dist.all_reduce(api.ones(4), group=sub01))
            out["took"] = time.time() - float(store.get("anyloss/killed"))
        else:
            try:
                while True:
                    dist.all_reduce(x, group=sub123)
            except api.Error as err:
                out["sub"] = api.describe(err)
            if rank == 1:
                # only the subgroup knows the loss here: not the default group's record (nor, on torch,
                # the watch's)
                out["world_knew"] = ([sorted(api.watch_lost()), sorted(api.ndist_group().lost_members())] if api.torch
                                     else [api.failed_ranks()])
                learnt.set()
        return api.finish(rank, out, [2] if api.torch else None)


def _hold_numbering(learnt, hold_s) -> None:
    """Hold ``_World.numbering_lock`` (which ndist's member watch takes to record a loss)
    until ``learnt`` is set, and ``hold_s`` seconds more."""
    from ndist.runtime._world import _world

    held = threading.Event()

    def hold():
        with _world.numbering_lock:
            held.set()
            learnt.wait(60)
            time.sleep(hold_s)

    threading.Thread(target=hold, daemon=True).start()
    held.wait(60)


def _later(fn, learnt, hold_s):
    def held(*args):
        learnt.wait(60)
        time.sleep(hold_s)
        fn(*args)

    return held


def _hold_torch_tellers(api, sub, learnt, hold_s) -> None:
    """torch's member watch tells a loss only once ``learnt`` is set and ``hold_s`` seconds
    have passed; so does ``sub``'s socket backend, which tells the process's other groups (the
    default group's backend among them) of a loss it found after failing its own waiters (on
    its own thread here, as when another thread found it)."""
    watch = api.watch()
    watch.on_loss = _later(watch.on_loss, learnt, hold_s)
    from ndist.torch._compiled import python_group

    failure = python_group(sub).ndist_group.backend_for("cpu").failure
    spread = _later(failure._spread, learnt, hold_s)
    failure._spread = lambda *args: threading.Thread(target=spread, args=args, daemon=True).start()


def check_told_by_any_group(res, hold_s) -> None:
    assert res[2] is None
    one = res[1]
    assert (one["sub"]["kind"], one["sub"]["failed"]) == ("DistRankFailureError", [1]), one  # rank 2: group rank 1
    assert all(k == [] for k in one["world_knew"]), one  # the case: the default group did not know yet
    sub = res[0]["sub"]
    assert (sub["kind"], sub["failed"], sub["rank"]) == ("DistRankFailureError", [], 2), res[0]
    assert "shrink_group" in sub["msg"], sub["msg"]
    assert res[0]["took"] < hold_s, res[0]  # released by rank 1's shrink, not by any timeout
    check_survivors(res, (0, 1, 3), 3, 1.0 + 2.0 + 4.0, renumbered={0: 0, 1: 1, 3: 2})


# --------------------------------------------- a shrink with operations pending on the excluded
def pending_on_excluded(rank, size, api, timeout_s, hold_s):
    """4 ranks: rank 2's member watch is held back until rank 2 has seen ranks 0 and 1 learn of
    the loss, and ``hold_s`` seconds more; rank 2 posts an ``isend`` and an ``irecv`` with rank
    3 on the world, which has no link to rank 3; rank 3 dies (ndist: once they are posted;
    torch: inside ``init_process_group``, its watch up and its backend's address not
    published); the three shrink excluding rank 3 (the group timeout is ``timeout_s``)."""
    api = Api(api)
    dist = api.dist
    got = {}
    if api.torch:
        from ndist.torch import _watch

        start = _watch.start

        def started(store, *args):  # the default group's store (ndist's form), and rank 3 dies here
            start(store, *args)
            got["store"] = store
            if rank == 3:  # the watch is up; the group's backend (its address) is not
                store.wait(["pending/posted"])
                store.set("pending/killed", "1")
                die()

        _watch.start = started
    with api.joined(timeout_s):
        store = got["store"] if api.torch else api.store
        out, pending = {}, []
        if rank == 2:  # the watch cannot tell rank 3's loss until asked
            asked = threading.Event()
            if api.torch:
                api.watch().on_loss = _later(api.watch().on_loss, asked, hold_s)
            else:
                _hold_numbering(asked, hold_s)
            pending = [dist.isend(api.lib.arange(4, dtype=api.lib.float32), dst=3),
                       dist.irecv(api.lib.empty(4, dtype=api.lib.float32), src=3)]
            store.set("pending/posted", "1")
        if rank == 3:
            store.wait(["pending/posted"])
            store.set("pending/killed", "1")
            die()
        if rank == 2:
            store.wait(["pending/killed", "pending/saw/0", "pending/saw/1"])
            # the case: neither the watch's record nor the group's holds the loss, the ops still wait
            out["knew"] = [sorted(api.watch_lost()),
                           sorted(api.ndist_group().lost_members()) if api.torch else api.failed_ranks()]
            out["completed"] = [w.is_completed() for w in pending]
            asked.set()
        else:
            wait_for(lambda: 3 in api.watch_lost(), "rank 3's loss was never told")
            store.set(f"pending/saw/{rank}", "1")
        api.shrink_and_sum(rank, [3] if api.torch or rank == 2 else None, out)
        out["pending"] = [api.attempt(w.wait) for w in pending]  # failed at the shrink, naming rank 3
        dist.barrier()
        return out


def check_pending_on_excluded(res, api, timeout_s) -> None:
    assert res[3] is None
    two = res[2]
    assert two["knew"] == [[], []], two  # the case: not known yet
    assert two["shrink"] < timeout_s / 2, two  # the hold, not the group timeout
    if api == "torch":
        assert two["completed"] == [False, False], two  # both still pending
        assert [(p["type"], p["kind"], p["failed"]) for p in two["pending"]] == \
            [("DistNetworkError", "DistRankFailureError", [3])] * 2, two
    else:
        assert [p["type"] for p in two["pending"]] == ["DistRankFailureError"] * 2, two
    check_survivors(res, (0, 1, 2), 3, 6.0)


# ---------------------------------------------------- a survivor blocked in a healthy subgroup
def blocked_subgroup(rank, size, api, how, folder):
    """4 ranks, subgroup [0, 1], rank 3 dies; ranks 0 and 2 learn of it on the world and
    shrink; rank 1 waits in an op on [0, 1] (``how``: its first op, "first"; after one,
    "linked"; a ``recv``, "recv") that rank 0 never joins."""
    api = Api(api)
    dist = api.dist
    with api.joined(20.0):
        x = api.ones(4)
        dist.all_reduce(x)
        sub = dist.new_group([0, 1])
        if how != "first" and rank in (0, 1):
            dist.all_reduce(x, group=sub)  # the subgroup's links exist
        dist.barrier()
        all_past(folder, rank, 4, victim=3)
        if rank == 3:
            die()
        out = {}
        if rank == 1:  # waits in [0, 1]; rank 0 never joins
            if how == "recv":
                api.timed(out, lambda: dist.recv(api.lib.zeros(4, dtype=api.lib.float32), src=0, group=sub))
            else:
                api.timed(out, lambda: dist.all_reduce(api.ones(4), group=sub))
            if not api.torch:  # revoked: the next op on it fails at once too
                again = api.attempt(lambda: dist.all_reduce(api.ones(4), group=sub))
                out["again"] = again if again == "no error" else again["rank"]
        else:
            out["world"] = api.until_loss(x)["failed"]
            if rank == 0:
                time.sleep(0.5)  # rank 1 is blocked in the subgroup by now
        api.shrink_and_sum(rank, api.failed_ranks() if api.torch else None, out)
        if not api.torch:
            out["sub_destroyed"] = sub.destroyed
        dist.barrier()
        return out


def check_blocked_subgroup(res, api) -> None:
    assert res[3] is None
    got = res[1]
    sub = got["sub"]
    assert (sub["kind"], sub["failed"], sub["rank"]) == ("DistRankFailureError", [], 3), got
    assert got["took"] < 3.0, got  # (rank 0 goes to the shrink 0.5 s after the loss)
    check_survivors(res, (0, 1, 2), 3, 6.0)
    if api == "torch":
        return
    assert "rank 3" in sub["msg"] and "shrink_group" in sub["msg"], sub["msg"]
    assert got["again"] == 3, got
    for rank in (0, 1, 2):
        assert res[rank]["sub_destroyed"] and res[rank]["shrink_sum"] < 5.0, (rank, res[rank])
    assert res[0]["world"] == [3] and res[2]["world"] == [3], res


# -------------------------------------------------------------- a rank lost inside the shrink
def lose(api: Api, rank: int, size: int, victim: int) -> None:
    """An all_reduce, then ``victim`` dies (``kill_sync``) and the others all-reduce until
    their group knows it."""
    x = api.ones(4)
    api.dist.all_reduce(x)
    all_past(api.store, rank, size, victim=victim)
    if rank == victim:
        die()
    api.until_loss(x)


def lost_during_shrink(rank, size, api, when):
    """4 ranks: rank 3 dies; the survivors shrink, and rank 2 dies inside the agreement: once
    it posted what it saw, at its first pause ("pause", where it dies as it adopts the
    decision too), or as it adopts the decision ("adopt"). A survivor that learns of rank 2
    only on the shrunk group shrinks that one. Shrinks exclude ``get_failed_ranks()`` on
    torch (its ``shrink_group`` takes a list: no None)."""
    import ndist.runtime._shrink as shrink

    api = Api(api)
    dist = api.dist
    with api.joined(30.0 if api.torch else 120.0):
        lose(api, rank, size, 3)
        if rank == 2:  # lost inside the agreement
            def dies(*a, **k):
                die()

            if when == "pause":
                shrink.time = types.SimpleNamespace(monotonic=shrink.time.monotonic, sleep=dies)
            shrink._adopt = dies
        t0 = time.monotonic()
        exclude = api.failed_ranks if api.torch else lambda: None
        shrinks = 1
        dist.shrink_group(exclude())
        while True:
            y = api.full(4, rank + 1)
            try:
                dist.all_reduce(y)
                break
            except api.RankFailure:
                dist.shrink_group(exclude())
                shrinks += 1
        return {"size": dist.get_world_size(), "rank": dist.get_rank(), "sum": float(y[0]), "shrinks": shrinks,
                "seconds": time.monotonic() - t0}


def check_lost_during_shrink(res, api) -> None:
    assert res[2] is None and res[3] is None
    for rank in (0, 1):
        r = res[rank]
        assert (r["size"], r["sum"]) == (2, 3.0), (rank, r)
        if api == "torch":
            assert r["rank"] == rank and r["seconds"] < 20.0, (rank, r)  # (not the 30 s group timeout)
