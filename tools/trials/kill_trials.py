"""Randomized kill trials: a random rank of 4 dies (SIGKILL) or stops (SIGSTOP) at a random
point of a random mix of collectives and point-to-point traffic, under ndistrun.

    python tools/trials/kill_trials.py [--trials 200] [--seed 0] [--transports tcp,shm,auto]
                                     [--engines python,native] [--stop-trials 6] [--max-latency 1.0]
                                     [--continue-trials 0] [--sizes 4,8] [--losses 1,2] [--only N,...]

Each trial starts ``ndistrun --nproc-per-node 4`` on this file (``--job``). Every rank draws
the same op sequence from the trial's seed: the collectives of ``soak.py`` (8 dtypes, empty
and uneven sizes, uneven ``all_to_all``, async ones waited in batches, the world and three
subgroups, every result checked against NumPy) mixed with point-to-point rings (blocking
send/recv, isend/irecv, ``batch_isend_irecv`` both ways) on the same groups, also checked.
Trials cycle through the transports x engines given (``NDIST_TRANSPORT``, ``NDIST_ENGINE``).

The victim dies in one of two ways, drawn per trial: it SIGKILLs itself before op K
(``op``), or the harness SIGKILLs it a random delay after every rank is ready (``timer``,
which lands anywhere, inside a C call of the native engine included). Both record the
wall-clock time of the kill (same host). Each survivor records when it raised, what, and
which rank it named, then waits for the other survivors and exits 3.

Counted per trial (any one fails the trial):
  hang       the launcher did not end within ``--hard-timeout``
  wrong      a result differed from NumPy (before or after the kill)
  survivor   a survivor raised no error, or one that is not a ``DistError``, or one whose
             message / ``.rank`` does not name the victim, or none was recorded
  late       kill -> raise longer than ``--max-latency`` (stop trials: not within the
             group timeout + 2 s, or before it)
  files      files of the job left in /dev/shm (found by the job's secret)
  procs      processes of the trial still alive after the launcher exits
  launcher   exit status 0, or (kill trials) its summary does not name the rank and SIGKILL

Not counted as a failure, listed apart (``blocked``): a survivor that times out waiting,
in a group without the victim, on another survivor that had already failed (> 1 s
before) and stopped calling. That group is healthy; no runtime can name the dead rank
there (torch and MPI would wait too). A real program exits on its error, and the waiter
then fails at once naming that survivor.

Stop trials (``--stop-trials``, the last ones): the harness SIGSTOPs the victim; the group
timeout is ``--stop-group-timeout`` (3 s); survivors must raise ``DistTimeoutError`` naming
it. Prints one line per trial and a summary table; exits 1 on any failure.

Continue trials (``--continue-trials``, after the others; issue 29): ``ndistrun
--nproc-per-node n --on-failure continue --min-nproc n-k``, n from ``--sizes``, k victims
from ``--losses``, over ``--continue-transports`` x the engines. Ranks run a mix of the
world and the subgroups that fit (``SUBGROUPS_CONTINUE``; collectives and p2p rings) until
the loss, ``shrink_group()`` (again for each further loss), check the shrunk group's members
with its first collective, run ``--phase2-ops`` checked ops on it (the world only) and end
with ``destroy_process_group``. The first victim dies ``start`` (before any
collective), ``op`` (before op K) or ``timer`` (the harness); a second one dies with it
(``same``) or during the survivors' shrink (``shrink``: a timer started as it calls
``shrink_group``). Failed: hang, wrong result, a survivor without a ``DistRankFailureError``
naming only victims (by global rank: a subgroup's failed members, or for a subgroup aborted
by another survivor's shrink, ``failed_ranks`` [], the lost rank it names), a failed shrink, a final group other than the survivors, the launcher
not exiting 0 or not listing every victim, files or processes left. Recovery time: the first
kill -> the last survivor's first successful collective on the group without the victims.

Heal trials (``--heal-trials``, last; issue 44): ``ndistrun --nproc-per-node 4 --on-failure
replace examples/elastic_training.py --heal``, run through ``_heal_rank.py`` (which times it),
a victim and a kill step drawn from the seed, over ``--continue-transports`` x the engines. The
survivors shrink, the launcher starts the replacement, the survivors admit it with
``grow_group`` and rank 0 sends it the state. A share ``--heal-second`` of the trials adds a
second loss around the grow: a random survivor dies 0-``--max-grow-delay`` s after it enters
a ``grow_group`` while a newcomer is queued, or the first replacement dies as long after it
queued itself. Failed: hang, the launcher not exiting 0 or not listing each replacement, a
rank whose world sizes are not 4 -> 3 -> 4 (with a second loss: 4 -> 3 -> ... -> 4) or whose
weights differ from the single-process replay (the example's own check), files of the job
left in ``/dev/shm`` (the secret read from a rank's environment while it runs), processes
left. Time to heal (one loss): the victim's self-kill -> the last member's first collective
on the regrown group returned; with the replacement's own times (process start, first line
of Python, imports done, admitted). ``--startup-runs N`` times the replacement's interpreter
start-up alone (``_heal_rank.py --startup-only``: the interpreter, NumPy, ndist and the
example imported), spread over the heal trials.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zlib
from pathlib import Path

import numpy as np

import soak  # the op mix and the NumPy oracle: tools/trials/soak.py, beside this script (sys.path[0])
from _procs import pids_with_env  # tools/trials/_procs.py, beside this script

#: the checkout (tools/trials/ is two below it): its ndist for the trials' launchers and ranks
ROOT = Path(__file__).resolve().parents[2]

WORLD = 4
#: the subgroups of the continue trials' first phase (those that fit the world size)
SUBGROUPS_CONTINUE = ((0, 1), (1, 2, 3), (0, 2), (4, 5, 6, 7), (1, 3, 5, 7))
TOKEN_ENV = "NDIST_KILL_TRIAL_TOKEN"
P2P = ("ring", "iring", "batch")


# ---------------------------------------------------------------- the rank's side

def _p2p(dist, kind: str, ranks, pg, rank: int, seed: int, i: int, rng):
    """A ring over ``ranks`` (global ranks; ``pg`` its group): returns (works, check)."""
    dtype = soak.DTYPES[rng.integers(len(soak.DTYPES))]
    count = int(rng.choice([0, 1, 5, 300, 4099, 20_000]))
    tag = int(rng.integers(0, 5))
    n, me = len(ranks), ranks.index(rank)
    nxt, prv = ranks[(me + 1) % n], ranks[(me - 1) % n]
    data = lambda r, salt=0: soak._data(seed, i * 2 + salt, r, dtype, count)  # noqa: E731
    y = np.empty(count, dtype)
    checks = [(y, data(prv))]
    works = []
    if kind == "ring":
        dist.send(data(rank), dst=nxt, group=pg, tag=tag)
        dist.recv(y, src=prv, group=pg, tag=tag)
    elif kind == "iring":
        works = [dist.isend(data(rank), dst=nxt, group=pg, tag=tag), dist.irecv(y, src=prv, group=pg, tag=tag)]
    else:  # both directions at once
        z = np.empty(count, dtype)
        checks.append((z, data(nxt, 1)))
        ops = [dist.P2POp(dist.isend, data(rank), nxt, group=pg, tag=tag),
               dist.P2POp(dist.irecv, y, prv, group=pg, tag=tag),
               dist.P2POp(dist.isend, data(rank, 1), prv, group=pg, tag=tag + 10),
               dist.P2POp(dist.irecv, z, nxt, group=pg, tag=tag + 10)]
        works = dist.batch_isend_irecv(ops)

    def check():
        for got, want in checks:
            if not soak._close(got, want, dtype):
                raise AssertionError(f"op {i} {kind} {dtype}[{count}] group {ranks}: wrong data from rank {prv}")
    return works, check


def _describe(err: BaseException) -> dict:
    """A survivor's error for its record; one that is no DistError (a bug) with its traceback."""
    import traceback

    import ndist.distributed as dist
    typed = isinstance(err, dist.DistError)
    return {"type": type(err).__name__, "dist_error": typed,
            "peer": getattr(err, "rank", None), "host": getattr(err, "host", None), "msg": str(err)[:2000],
            "traceback": None if typed else "".join(traceback.format_exception(err))[-8000:]}


def job(spec_path: str) -> int:
    """One rank of a trial (run by ndistrun)."""
    from datetime import timedelta

    import ndist.distributed as dist

    spec = json.loads(Path(spec_path).read_text())
    if spec.get("mode") == "continue":
        return job_continue(spec)
    out, seed, victim, kill_op = Path(spec["out"]), spec["seed"], spec["victim"], spec["kill_op"]
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stay to report; the launcher SIGKILLs after its grace
    dist.init_process_group("socket", timeout=timedelta(seconds=spec["group_timeout"]))
    rank, size = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        (out / "secret").write_text(os.environ["NDIST_SECRET"])
    groups = [(tuple(range(size)), None)]
    for ranks in soak.SUBGROUPS:
        groups.append((ranks, dist.new_group(list(ranks))))
    dist.barrier()
    (out / f"pid{rank}").write_text(str(os.getpid()))
    plan = soak._Plan(seed, size)
    pending: list = []
    wrong: list[str] = []
    rec: dict = {"error": None}
    ops = 0
    now = {"group": None, "op": None}  # what this rank is waiting on

    def settle():
        try:
            for works, check, ranks, what in pending:
                now.update(group=ranks, op=what)
                for w in works:
                    w.wait()
                try:
                    check()
                except AssertionError as err:
                    wrong.append(str(err))
        finally:
            pending.clear()

    deadline = time.monotonic() + spec["max_seconds"]
    try:
        for i in range(10**9):
            if rank == victim and i == kill_op:
                (out / "killed").write_text(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            if time.monotonic() > deadline:
                break
            p = plan.draw(i, groups)  # every rank draws every op, in or out of its group
            rng = np.random.default_rng([seed, i, 99])
            p2p = rng.random() < 0.3
            g = int(rng.integers(len(groups))) if p2p else p["group"]
            ranks, pg = groups[g]
            if rank not in ranks:
                continue
            ops += 1
            now.update(group=ranks, op=P2P[0] if p2p else p["op"])
            if p2p:
                kind = P2P[rng.integers(len(P2P))]
                now.update(op=kind)
                works, check = _p2p(dist, kind, ranks, pg, rank, seed, i, rng)
            else:
                w, check = soak._run_one(dist, p, ranks, pg, rank, seed)
                works = [w] if w is not None else []
            if works:
                pending.append((works, check, ranks, now["op"]))
                if len(pending) >= 4:
                    settle()
            else:
                try:
                    check()
                except AssertionError as err:
                    wrong.append(str(err))
        settle()
    except Exception as err:  # noqa: BLE001 - recorded: the survivor's error
        rec["error"] = _describe(err)
        rec["waiting"] = dict(now)
    rec.update(t=time.time(), ops=ops, wrong=wrong[:5], n_wrong=len(wrong))
    (out / f"r{rank}.tmp").write_text(json.dumps(rec))
    os.replace(out / f"r{rank}.tmp", out / f"r{rank}.json")
    # stay until every other survivor has recorded: exiting resets this rank's connections,
    # and a slower survivor could then see this rank vanish first
    stay = time.monotonic() + spec["stay"]
    while time.monotonic() < stay and len(glob.glob(str(out / "r*.json"))) < size - 1:
        time.sleep(0.01)
    return 3 if rec["error"] else 0


def _mix(dist, plan, i: int, size: int, rank: int, seed: int, pending: list, wrong: list, now: dict,
         groups=None) -> None:
    """Op ``i`` of a mix on ``groups`` ((ranks, group) pairs; None: the world only) of
    collectives and point-to-point rings (async ones queued in ``pending``, waited in
    batches of 4). Every rank draws every op; a rank skips those of groups it is not in."""
    groups = groups or [(tuple(range(size)), None)]
    p = plan.draw(i, groups)
    rng = np.random.default_rng([seed, i, 99])
    p2p = rng.random() < 0.3
    ranks, pg = groups[int(rng.integers(len(groups))) if p2p else p["group"]]
    if rank not in ranks:
        return
    now.update(group=list(ranks))
    if p2p:
        kind = P2P[rng.integers(len(P2P))]
        now.update(op=kind)
        works, check = _p2p(dist, kind, ranks, pg, rank, seed, i, rng)
    else:
        now.update(op=p["op"])
        w, check = soak._run_one(dist, p, ranks, pg, rank, seed)
        works = [w] if w is not None else []
    if works:
        pending.append((works, check, list(ranks)))
    else:
        try:
            check()
        except AssertionError as err:
            wrong.append(str(err))
    if len(pending) >= 4 or not works:
        _settle(pending, wrong, now)


def _settle(pending: list, wrong: list, now: dict | None = None) -> None:
    """Wait for the queued ops and check them (``now["group"]``: the ranks of the group
    waited on, for the error's ranks)."""
    try:
        for works, check, ranks in pending:
            if now is not None:
                now["group"] = ranks
            for w in works:
                w.wait()
            try:
                check()
            except AssertionError as err:
                wrong.append(str(err))
    finally:
        pending.clear()


def _die(out: Path, rank: int) -> None:
    (out / f"killed{rank}").write_text(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


def job_continue(spec: dict) -> int:
    """One rank of a ``--on-failure continue`` trial: a mix of the world and subgroups until the loss,
    ``shrink_group`` (again for every further loss), a check of the members, then a
    mix on the shrunk world. ``spec["when"]``: original rank -> how it dies: ``start``
    (right after init_process_group, before any collective), ``op`` (before op
    ``spec["kill_op"]``), ``shrink`` (a timer of ``spec["shrink_delay"]`` s started as it
    calls shrink_group: during the agreement, the rebuild or the mix after it; at the end of
    that mix at the latest), ``timer`` (the harness)."""
    from datetime import timedelta

    import ndist.distributed as dist

    out, seed = Path(spec["out"]), spec["seed"]
    when = {int(r): w for r, w in spec["when"].items()}
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    dist.init_process_group("socket", timeout=timedelta(seconds=spec["group_timeout"]))
    rank0, size0 = dist.get_rank(), dist.get_world_size()
    mine = when.get(rank0)
    if rank0 == 0:
        (out / "secret").write_text(os.environ["NDIST_SECRET"])
    (out / f"pid{rank0}").write_text(str(os.getpid()))
    if mine == "start":
        _die(out, rank0)
    rec: dict = {"error": None, "shrinks": 0, "oks": [], "wrong": [], "members": None, "shrink_errors": []}
    wrong: list[str] = []
    pending: list = []
    now: dict = {"op": None, "group": None}
    plan = soak._Plan(seed, size0)
    # the world and subgroups (a survivor blocked in a subgroup on a member that went to
    # shrink_group is released by it: _World.begin_default_shrink)
    groups = [(tuple(range(size0)), None)]
    for ranks in SUBGROUPS_CONTINUE:
        if max(ranks) < size0:
            groups.append((ranks, dist.new_group(list(ranks))))
    try:
        deadline = time.monotonic() + spec["max_seconds"]
        for i in range(10**9):  # until the loss (a harness kill may come late)
            if mine == "op" and i == spec["kill_op"]:
                _die(out, rank0)
            if time.monotonic() > deadline:
                break
            _mix(dist, plan, i, size0, rank0, seed, pending, wrong, now, groups)
        _settle(pending, wrong, now)
        now.update(group=list(range(size0)), op="all_reduce")
        dist.all_reduce(np.ones(1))  # the end of phase 1: every survivor learns of a loss here at the latest
    except Exception as err:  # noqa: BLE001 - recorded: the survivor's error
        if mine == "op":  # (a victim of ``same`` that learnt of the other's loss before its op K)
            _die(out, rank0)
        rec["error"] = _describe(err)
        failed = getattr(err, "failed_ranks", None)
        rec["error"]["failed_ranks"] = failed
        # by global rank: the group's failed members, or (a group aborted by another
        # survivor's shrink: none of its members lost) the lost process it names
        ranks = now.get("group") or list(range(size0))
        if failed is not None:
            rec["error"]["failed_global"] = ([ranks[r] for r in failed if 0 <= r < len(ranks)] if failed
                                             else [getattr(err, "rank", None)])
        rec["error"]["t"] = time.time()
        rec["waiting"] = now.get("op")
        pending.clear()
    i, done = 0, False
    while not done and rec["error"] is not None:
        if mine == "shrink" and rec["shrinks"] == 0:
            threading.Timer(spec["shrink_delay"], _die, (out, rank0)).start()
        try:
            shrunk = dist.shrink_group()
            rec["shrinks"] += 1
            members = np.zeros(size0)
            members[rank0] = 1.0
            dist.all_reduce(members)  # the first collective on the shrunk group
            rec["oks"].append((time.time(), dist.get_world_size()))
            if members.max() != 1.0 or int(members.sum()) != dist.get_world_size():
                wrong.append(f"members {members.tolist()} on a group of {dist.get_world_size()}")
            rec["members"] = [int(r) for r in np.flatnonzero(members)]
            size, rank = dist.get_world_size(), dist.get_rank()
            # a new mix at the new size, drawn alike by every member: from the group's name (a
            # survivor may have called shrink_group once where another called it twice)
            plan2 = soak._Plan([seed, zlib.crc32(shrunk.group_name.encode())], size)
            for i in range(spec["phase2_ops"]):
                _mix(dist, plan2, i, size, rank, seed + 1, pending, wrong, now)
            _settle(pending, wrong)
            if mine == "shrink":  # (its timer has not fired: the shrink and the mix were quicker) now,
                _die(out, rank0)  # before the barrier that would let the survivors finish with it
            dist.barrier()
            done = True
        except dist.DistRankFailureError as err:  # a further loss: shrink again
            rec.setdefault("later", []).append(_describe(err))
            pending.clear()
        except Exception as err:  # noqa: BLE001 - recorded: the shrink failed
            rec["shrink_errors"].append(_describe(err))
            break
    rec.update(t=time.time(), wrong=wrong[:5], n_wrong=len(wrong), size=dist.get_world_size(), done=done)
    (out / f"r{rank0}.tmp").write_text(json.dumps(rec))
    os.replace(out / f"r{rank0}.tmp", out / f"r{rank0}.json")
    if done:
        dist.destroy_process_group()
    return 0 if done and not wrong else 3


# ---------------------------------------------------------------- the harness

def _job_files(secret: str) -> list[str]:
    from ndist.runtime._shmfiles import SHM_DIR, job_prefix
    return sorted(glob.glob(os.path.join(SHM_DIR, job_prefix(secret) + "*")))


def _token_pids(token: str) -> list[int]:
    """Processes (of this user) whose environment carries the trial's token."""
    return pids_with_env(TOKEN_ENV, token)


def _kill_leftovers(token: str, res: dict) -> None:
    """A trial's processes still alive after its launcher ended: a failure of the trial
    (``procs: N left``), and killed."""
    left = _token_pids(token)
    if left:
        res["fails"].append(f"procs: {len(left)} left")
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _end_trial(proc, log, t0: float, a, token: str, res: dict) -> str:
    """The end every trial shares: wait for the job up to ``a.hard_timeout`` from ``t0`` (past
    it, a hang: its session is killed), its wall time, the leftovers check; the job's output."""
    try:
        proc.wait(timeout=max(1.0, a.hard_timeout - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        res["fails"].append("hang")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    res["wall"] = time.monotonic() - t0
    time.sleep(0.2)
    _kill_leftovers(token, res)
    log.seek(0)
    return log.read()


def _names(rec_err: dict, victim: int) -> bool:
    if rec_err.get("peer") == victim:
        return True
    msg = rec_err.get("msg", "")
    if re.search(rf"\brank {victim}\b", msg):
        return True
    # "ranks not heard from: [2]", or a group's set-up: "ranks [2] did not connect within the timeout"
    for listed in re.findall(r"(?:not heard from: |ranks )\[([^\]]*)\]", msg):
        if str(victim) in [s.strip() for s in listed.split(",")]:
            return True
    return False


def run_trial(n: int, seed: int, transport: str, engine: str, mode: str, a) -> dict:
    rng = np.random.default_rng([seed, 12345])
    victim = int(rng.integers(WORLD))
    kill_op = int(rng.integers(0, a.max_kill_op)) if mode == "op" else -1
    delay = float(rng.uniform(0, a.max_delay))
    stop = mode == "stop"
    gt = a.stop_group_timeout if stop else a.group_timeout
    res = dict(trial=n, seed=seed, transport=transport, engine=engine, mode=mode, victim=victim, fails=[],
               latencies=[], blocked=[], wall=0.0)
    token = uuid.uuid4().hex
    with tempfile.TemporaryDirectory(prefix="ndist-kill-") as d:
        out = Path(d)
        spec = dict(out=d, seed=seed, victim=victim, kill_op=kill_op, group_timeout=gt,
                    max_seconds=gt + 30, stay=gt + 5)
        (out / "spec.json").write_text(json.dumps(spec))
        env = dict(os.environ, NDIST_TRANSPORT=transport, NDIST_ENGINE=engine, **{TOKEN_ENV: token})
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        term = gt + 10
        cmd = [sys.executable, "-m", "ndist.launch", "--nproc-per-node", str(WORLD), "--term-timeout", str(term),
               __file__, "--job", str(out / "spec.json")]
        t0 = time.monotonic()
        with open(out / "log", "w+") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            killed_at = None
            if mode in ("timer", "stop"):
                pidf = [out / f"pid{r}" for r in range(WORLD)]
                while not all(p.exists() for p in pidf) and proc.poll() is None \
                        and time.monotonic() - t0 < a.hard_timeout:
                    time.sleep(0.01)
                if proc.poll() is None and all(p.exists() for p in pidf):
                    time.sleep(delay)
                    pid = int(pidf[victim].read_text())
                    killed_at = time.time()
                    os.kill(pid, signal.SIGSTOP if stop else signal.SIGKILL)
            text = _end_trial(proc, log, t0, a, token, res)
        res["rc"] = proc.returncode
        if mode == "op" and (out / "killed").exists():
            killed_at = float((out / "killed").read_text())
        if killed_at is None:
            res["fails"].append("no kill happened")
        secret = (out / "secret").read_text() if (out / "secret").exists() else None
        if secret is None:
            res["fails"].append("no secret recorded")
        else:
            leaked = _job_files(secret)
            if leaked:
                res["fails"].append(f"files: {len(leaked)} left")
                for f in leaked:
                    os.unlink(f)
        if "hang" not in res["fails"]:
            if proc.returncode == 0:
                res["fails"].append("launcher exited 0")
            elif not stop and not (re.search(rf"root cause.*\n\s*rank\s*:\s*{victim}\b", text)
                                   and "killed by SIGKILL" in text):
                res["fails"].append("launcher summary does not name the rank")
        recs = {r: json.loads((out / f"r{r}.json").read_text()) for r in range(WORLD)
                if r != victim and (out / f"r{r}.json").exists()}
        earlier = lambda t: any(x["error"] and x["t"] < t - 1 for x in recs.values())  # noqa: E731
        for r in range(WORLD):
            if r == victim:
                continue
            path = out / f"r{r}.json"
            if not path.exists():
                res["fails"].append(f"rank {r}: no record")
                continue
            rec = json.loads(path.read_text())
            if rec["n_wrong"]:
                res["fails"].append(f"wrong: rank {r}: {rec['wrong'][0]}")
            err = rec["error"]
            if err is None:
                res["fails"].append(f"survivor: rank {r} raised nothing")
                continue
            lat = rec["t"] - killed_at if killed_at is not None else None
            what = f"rank {r}: {err['type']}: {err['msg'][:300]}"
            waiting = rec.get("waiting") or {}
            if not stop and err["type"] == "DistTimeoutError" and waiting.get("group") is not None \
                    and victim not in waiting["group"] and earlier(rec["t"]):
                # waiting, in a group without the victim, on a survivor that had already
                # failed and stopped calling: no runtime can tell (that group is healthy)
                res["blocked"].append(f"{what} (waiting on {waiting['op']} in group {waiting['group']})")
                continue
            res["latencies"].append(lat)
            if not err["dist_error"]:
                res["fails"].append(f"survivor: not a DistError: {what}")
            elif stop and err["type"] != "DistTimeoutError":
                res["fails"].append(f"survivor: not a DistTimeoutError: {what}")
            elif not _names(err, victim):
                res["fails"].append(f"survivor: does not name rank {victim}: {what}")
            if lat is not None:
                if stop and not (gt - 0.5 <= lat <= gt + 2):
                    res["fails"].append(f"late: rank {r} after {lat:.2f} s (group timeout {gt} s)")
                elif not stop and lat > a.max_latency:
                    res["fails"].append(f"late: rank {r} after {lat:.2f} s: {what}")
        if res["fails"] and a.keep_logs:
            keep = Path(a.keep_logs) / f"trial{n}-seed{seed}"
            keep.mkdir(parents=True, exist_ok=True)
            for f in out.iterdir():
                if f.is_file():
                    (keep / f.name).write_bytes(f.read_bytes())
    return res


def _draw_continue(seed: int, a) -> dict:
    """A continue trial's world size, victims and how each dies."""
    rng = np.random.default_rng([seed, 777])
    n = int(rng.choice([int(x) for x in a.sizes.split(",")]))
    k = int(rng.choice([int(x) for x in a.losses.split(",")]))
    victims = [int(v) for v in rng.choice(n, size=k, replace=False)]
    first = str(rng.choice(["start", "op", "op", "timer"]))
    when = {victims[0]: first}
    second = None
    if k == 2:
        second = str(rng.choice(["same", "shrink"]))  # simultaneous, or during the survivors' shrink
        when[victims[1]] = first if second == "same" else "shrink"
    return dict(n=n, k=k, victims=victims, when=when, moment=first + (f"+{second}" if second else ""),
                kill_op=int(rng.integers(0, a.max_kill_op_continue)), delay=float(rng.uniform(0, a.max_delay)),
                shrink_delay=float(rng.uniform(0, a.max_shrink_delay)))


def run_continue_trial(n: int, seed: int, transport: str, engine: str, a) -> dict:
    """A ``--on-failure continue`` trial: the survivors must shrink and finish with
    correct results, the launcher exit 0 naming every lost rank; recovery time = the
    first kill -> the first successful collective on the group without every victim."""
    d = _draw_continue(seed, a)
    size, victims = d["n"], d["victims"]
    survivors = [r for r in range(size) if r not in victims]
    res = dict(trial=n, seed=seed, transport=transport, engine=engine, mode="continue", size=size,
               losses=d["k"], victims=victims, moment=d["moment"], fails=[], recovery=None, wall=0.0)
    token = uuid.uuid4().hex
    with tempfile.TemporaryDirectory(prefix="ndist-kill-") as tmp:
        out = Path(tmp)
        spec = dict(mode="continue", out=tmp, seed=seed, when={str(r): w for r, w in d["when"].items()},
                    kill_op=d["kill_op"], shrink_delay=d["shrink_delay"], group_timeout=a.group_timeout,
                    max_seconds=a.group_timeout + 30, phase2_ops=a.phase2_ops)
        (out / "spec.json").write_text(json.dumps(spec))
        env = dict(os.environ, NDIST_TRANSPORT=transport, NDIST_ENGINE=engine, **{TOKEN_ENV: token})
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", "ndist.launch", "--nproc-per-node", str(size), "--on-failure", "continue",
               "--min-nproc", str(len(survivors)), "--term-timeout", str(a.group_timeout + 10), __file__,
               "--job", str(out / "spec.json")]
        t0 = time.monotonic()
        with open(out / "log", "w+") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            timed = [r for r, w in d["when"].items() if w == "timer"]
            if timed:
                pidf = [out / f"pid{r}" for r in range(size)]
                while not all(p.exists() for p in pidf) and proc.poll() is None \
                        and time.monotonic() - t0 < a.hard_timeout:
                    time.sleep(0.01)
                if proc.poll() is None and all(p.exists() for p in pidf):
                    time.sleep(d["delay"])
                    pids = [int(pidf[r].read_text()) for r in timed]
                    for r, pid in zip(timed, pids):
                        (out / f"killed{r}").write_text(repr(time.time()))
                        os.kill(pid, signal.SIGKILL)
            text = _end_trial(proc, log, t0, a, token, res)
        res["rc"] = proc.returncode
        kills = {r: float((out / f"killed{r}").read_text()) for r in victims if (out / f"killed{r}").exists()}
        if len(kills) != len(victims):
            res["fails"].append(f"not every victim was killed: {sorted(kills)} of {victims}")
        secret = (out / "secret").read_text() if (out / "secret").exists() else None
        if secret is None:
            res["fails"].append("no secret recorded")
        else:
            leaked = _job_files(secret)
            if leaked:
                res["fails"].append(f"files: {len(leaked)} left")
                for f in leaked:
                    os.unlink(f)
        if "hang" not in res["fails"]:
            if proc.returncode != 0:
                res["fails"].append(f"launcher exited {proc.returncode}")
            lost = "rank" if len(victims) == 1 else "ranks"
            if f"finished without {len(victims)} lost {lost} (--on-failure continue)" not in text \
                    or not all(re.search(rf"rank\s*:\s*{v}\b", text) for v in victims) \
                    or text.count("killed by SIGKILL") < len(victims):
                res["fails"].append("launcher summary does not name every lost rank")
        oks = []
        for r in survivors:
            path = out / f"r{r}.json"
            if not path.exists():
                res["fails"].append(f"rank {r}: no record")
                continue
            rec = json.loads(path.read_text())
            if rec["n_wrong"]:
                res["fails"].append(f"wrong: rank {r}: {rec['wrong'][0]}")
            err = rec["error"]
            if err is None:
                res["fails"].append(f"survivor: rank {r} saw no loss")
            elif err["type"] != "DistRankFailureError" or not set(err.get("failed_global") or []) <= set(victims) \
                    or not err.get("failed_global"):
                res["fails"].append(f"survivor: rank {r}: {err['type']} (failed_ranks "
                                    f"{err.get('failed_ranks')}, global {err.get('failed_global')}): "
                                    f"{err['msg'][:300]}")
            for e in rec["shrink_errors"]:
                res["fails"].append(f"shrink: rank {r}: {e['type']}: {e['msg'][:300]}")
            if not rec["done"]:
                res["fails"].append(f"survivor: rank {r} did not finish")
            elif rec["members"] != survivors or rec["size"] != len(survivors):
                res["fails"].append(f"survivor: rank {r} ended in a group of {rec['members']}, expected {survivors}")
            res["shrinks"] = max(res.get("shrinks", 0), rec["shrinks"])
            res["later"] = max(res.get("later", 0), len(rec.get("later", [])))
            final = [t for t, s in rec["oks"] if s == len(survivors)]
            if final:
                oks.append(min(final))
        if kills and len(oks) == len(survivors):
            res["recovery"] = max(oks) - min(kills.values())
        if res["fails"] and a.keep_logs:
            keep = Path(a.keep_logs) / f"trial{n}-seed{seed}"
            keep.mkdir(parents=True, exist_ok=True)
            for f in out.iterdir():
                if f.is_file():
                    (keep / f.name).write_bytes(f.read_bytes())
    return res


def _secret_of(token: str) -> str | None:
    """The job secret in the environment of a live process of the trial (a rank)."""
    for pid in _token_pids(token):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                for item in f.read().split(b"\0"):
                    if item.startswith(b"NDIST_SECRET="):
                        return item.split(b"=", 1)[1].decode()
        except OSError:
            pass
    return None


def _draw_heal(seed: int, a) -> dict:
    rng = np.random.default_rng([seed, 44])
    victim, step = int(rng.integers(4)), int(rng.integers(40))
    second, slot2, delay = None, None, 0.0
    if rng.random() < a.heal_second:  # a second loss around the grow
        second = ("survivor", "newcomer")[int(rng.integers(2))]
        slot2 = int(rng.choice([r for r in range(4) if r != victim])) if second == "survivor" else victim
        delay = float(rng.uniform(0, a.max_grow_delay))
    return dict(victim=victim, step=step, second=second, slot2=slot2, delay=round(delay, 4))


def _read_records(d: Path) -> dict:
    """The rank records of a heal trial (``_heal_rank.py``), by file name."""
    out = {}
    for f in d.iterdir():
        if not f.name.endswith(".tmp"):
            try:
                out[f.name] = json.loads(f.read_text())
            except (OSError, ValueError):
                pass
    return out


def run_heal_trial(n: int, seed: int, transport: str, engine: str, a) -> dict:
    """A ``--on-failure replace`` trial of examples/elastic_training.py ``--heal`` (run through
    ``_heal_rank.py``, which times it and may add a second loss around the grow)."""
    draw = _draw_heal(seed, a)
    victim, step = draw["victim"], draw["step"]
    res = dict(trial=n, seed=seed, transport=transport, engine=engine, mode="heal", **draw, fails=[], wall=0.0,
               heal=None, boot=None, second_landed=False, grow_losses=0)
    token = uuid.uuid4().hex
    out = Path(tempfile.mkdtemp(prefix="heal-trial-"))
    env = dict(os.environ, NDIST_TRANSPORT=transport, NDIST_ENGINE=engine, HEAL_TRIAL_OUT=str(out),
               **{TOKEN_ENV: token})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    if draw["second"] == "survivor":
        env["HEAL_SECOND"] = f"survivor:{draw['slot2']}:{draw['delay']}"
    elif draw["second"] == "newcomer":
        env["HEAL_SECOND"] = f"newcomer:{draw['delay']}"
    cmd = [sys.executable, "-m", "ndist.launch", "--nproc-per-node", "4", "--on-failure", "replace",
           str(Path(__file__).resolve().parent / "_heal_rank.py"), "--kill-rank", str(victim), "--kill-step",
           str(step), "--heal"]
    t0 = time.monotonic()
    secret = None
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        while secret is None and proc.poll() is None and time.monotonic() - t0 < a.hard_timeout:
            secret = _secret_of(token)
            time.sleep(0.01)
        text = _end_trial(proc, log, t0, a, token, res)
    recs = _read_records(out)
    for f in out.iterdir():
        f.unlink()
    out.rmdir()
    res["rc"] = proc.returncode
    if secret is None:
        res["fails"].append("no secret read")
    else:
        leaked = _job_files(secret)
        if leaked:
            res["fails"].append(f"files: {len(leaked)} left")
            for f in leaked:
                os.unlink(f)
    lost = recs.get(f"lost-{victim}-0")
    lost2 = [v for k, v in recs.items() if k.startswith("lost2-")]
    res["second_landed"] = bool(lost2)
    res["grow_losses"] = len(re.findall(r"during the grow; shrinking|before the state came; shrinking", text))
    single = not lost2
    if "hang" not in res["fails"]:
        if proc.returncode != 0:
            res["fails"].append(f"launcher exited {proc.returncode}")
        if f"replaced rank {victim} (replacement 1 of --max-restarts 3" not in text:
            res["fails"].append("launcher summary does not list the replacement")
        if lost2 and draw["second"] == "survivor" and f"replaced rank {draw['slot2']} (replacement 1 of" not in text:
            res["fails"].append("launcher summary does not list the second replacement")
        for r in range(4):
            sizes = re.search(rf"\[rank{r}\]:world sizes: ([0-9 >-]+)", text)
            ok = sizes is not None and (sizes.group(1).strip() == "4 -> 3 -> 4" if single else
                                        re.fullmatch(r"4 -> 3( -> [234])* -> 4", sizes.group(1).strip()))
            if not ok:
                res["fails"].append(f"rank {r}: world sizes not 4 -> 3 -> 4" + ("" if single else " (or via 2, 3)"))
            if f"[rank{r}]:OK: every rank finished with the weights of the single-process replay" not in text:
                res["fails"].append(f"rank {r}: no OK")
    if not res["fails"] and lost is not None:
        healed = [max(v) for k, v in recs.items() if k.startswith("healed-")]
        if healed:
            res["heal"] = max(healed) - lost  # the loss -> the last member's first collective on the regrown group
        boot = recs.get(f"boot-{victim}-1")
        if boot is not None and single:
            res["boot"] = {k: v - lost for k, v in boot.items()}
    if res["fails"] and a.keep_logs:
        keep = Path(a.keep_logs) / f"trial{n}-seed{seed}"
        keep.mkdir(parents=True, exist_ok=True)
        (keep / "log").write_text(text)
        (keep / "records.json").write_text(json.dumps(recs, indent=1))
    return res


def startup_alone(runs: int) -> list[float]:
    """The replacement's interpreter start-up alone: ``_heal_rank.py --startup-only`` (the
    interpreter, NumPy, ndist.distributed and the example imported, then exit), wall seconds."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    out = []
    for _ in range(runs):
        t0 = time.monotonic()
        subprocess.run([sys.executable, str(Path(__file__).resolve().parent / "_heal_rank.py"), "--startup-only"],
                       env=env, check=True)
        out.append(time.monotonic() - t0)
    return out


def _summary_continue(results: list[dict]) -> str:
    rows = {}
    for r in results:
        rows.setdefault((r["size"], r["losses"], r["transport"], r["engine"]), []).append(r)
    lines = ["| n | losses | transport | engine | trials | passed | hangs | wrong | survivor / shrink errors | "
             "launcher | files | procs | recovery median / max (s) |", "|" + "---|" * 13]
    for key in sorted(rows):
        rs = rows[key]
        cnt = lambda pre: sum(any(f.startswith(pre) for f in r["fails"]) for r in rs)  # noqa: E731
        rec = [r["recovery"] for r in rs if r["recovery"] is not None]
        med = f"{np.median(rec):.3f} / {max(rec):.3f}" if rec else "-"
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {len(rs)} | {sum(not r['fails'] for r in rs)} | "
                     f"{cnt('hang')} | {cnt('wrong')} | {cnt('survivor') + cnt('shrink') + cnt('rank ')} | "
                     f"{cnt('launcher')} | {cnt('files')} | {cnt('procs')} | {med} |")
    bad = sum(bool(r["fails"]) for r in results)
    lines.append(f"continue trials={len(results)} failed={bad} load={os.getloadavg()[0]:.2f} (1-min, at the end)")
    return "\n".join(lines)


def _summary(results: list[dict], a) -> str:
    rows = {}
    for r in results:
        key = ("SIGSTOP" if r["mode"] == "stop" else "SIGKILL", r["transport"], r["engine"])
        rows.setdefault(key, []).append(r)
    lines = ["| signal | transport | engine | trials | hangs | wrong | survivor errors | late | files | procs "
             "| launcher | survivors | blocked | latency median / max (s) |", "|" + "---|" * 14]
    for key in sorted(rows):
        rs = rows[key]
        cnt = lambda pre: sum(any(f.startswith(pre) for f in r["fails"]) for r in rs)  # noqa: E731
        lats = [x for r in rs for x in r["latencies"] if x is not None]
        med = f"{np.median(lats):.3f} / {max(lats):.3f}" if lats else "-"
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {len(rs)} | {cnt('hang')} | {cnt('wrong')} | "
                     f"{cnt('survivor') + cnt('rank ')} | {cnt('late')} | {cnt('files')} | {cnt('procs')} | "
                     f"{cnt('launcher')} | {len(lats)} | {sum(len(r['blocked']) for r in rs)} | {med} |")
    bad = sum(bool(r["fails"]) for r in results)
    lines.append(f"trials={len(results)} failed={bad} load={os.getloadavg()[0]:.2f} (1-min, at the end)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=200, help="SIGKILL trials")
    ap.add_argument("--stop-trials", type=int, default=6, help="SIGSTOP trials, after the SIGKILL ones")
    ap.add_argument("--seed", type=int, default=0, help="trial n uses seed SEED + n")
    ap.add_argument("--transports", default="tcp,shm,auto")
    ap.add_argument("--engines", default="python,native")
    ap.add_argument("--max-latency", type=float, default=1.0, help="kill -> survivor's error, seconds")
    ap.add_argument("--group-timeout", type=float, default=20.0, help="of SIGKILL trials")
    ap.add_argument("--stop-group-timeout", type=float, default=3.0)
    ap.add_argument("--max-kill-op", type=int, default=120, help="op mode: the victim dies before op K < this")
    ap.add_argument("--max-delay", type=float, default=1.5, help="timer/stop mode: seconds after all are ready")
    ap.add_argument("--hard-timeout", type=float, default=120.0, help="per trial")
    ap.add_argument("--continue-trials", type=int, default=0,
                    help="--on-failure continue trials (survivors shrink and finish), after the others")
    ap.add_argument("--continue-transports", default="tcp,shm")
    ap.add_argument("--sizes", default="4,8", help="continue trials: world sizes drawn from")
    ap.add_argument("--losses", default="1,2", help="continue trials: simultaneous losses drawn from")
    ap.add_argument("--max-kill-op-continue", type=int, default=40, help="continue trials, op mode: before op K")
    ap.add_argument("--max-shrink-delay", type=float, default=0.05,
                    help="continue trials: a second victim dies this much (at most) after it calls shrink_group")
    ap.add_argument("--phase2-ops", type=int, default=20, help="continue trials: ops on the shrunk group")
    ap.add_argument("--heal-trials", type=int, default=0,
                    help="--on-failure replace trials (examples/elastic_training.py --heal), after the others")
    ap.add_argument("--heal-second", type=float, default=0.4,
                    help="heal trials: the share with a second loss around the grow (a survivor or the newcomer)")
    ap.add_argument("--max-grow-delay", type=float, default=0.05,
                    help="heal trials: the second victim dies this much (at most) after it enters the grow "
                         "(a survivor) or queued itself (the newcomer)")
    ap.add_argument("--startup-runs", type=int, default=0,
                    help="heal trials: time the replacement's interpreter start-up alone this many times, spread "
                         "over the heal trials (the same load)")
    ap.add_argument("--keep-logs", default=None, metavar="DIR", help="copy failed trials' files here")
    ap.add_argument("--json", default=None, metavar="FILE", help="write every trial's result here")
    ap.add_argument("--only", default=None, metavar="N[,N...]",
                    help="run only these trial numbers (as printed), each exactly as in the full run: the same "
                         "other arguments give it the same seed, transport, engine, victims and moment")
    a = ap.parse_args(argv)
    transports, engines = a.transports.split(","), a.engines.split(",")
    combos = [(t, e) for t in transports for e in engines]
    results = []
    t_start = time.monotonic()
    only = {int(x) for x in a.only.split(",")} if a.only else None
    for n in range(a.trials + a.stop_trials):
        if only is not None and n not in only:
            continue
        seed = a.seed + n
        transport, engine = combos[n % len(combos)]
        if n >= a.trials:
            mode = "stop"
        else:
            mode = ("op", "timer")[int(np.random.default_rng([seed, 54321]).integers(2))]
        r = run_trial(n, seed, transport, engine, mode, a)
        results.append(r)
        lats = [x for x in r["latencies"] if x is not None]
        print(f"trial {n:3d} seed {seed} {transport:4s} {engine:6s} {mode:5s} victim {r['victim']} "
              f"rc {r.get('rc')} wall {r['wall']:5.1f}s max latency {max(lats) if lats else float('nan'):.3f}s "
              f"{'OK' if not r['fails'] else 'FAIL: ' + '; '.join(r['fails'])}"
              f"{''.join('; blocked: ' + b for b in r['blocked'])}", flush=True)
    ccombos = [(t, e) for t in a.continue_transports.split(",") for e in engines]
    cont = []
    for m in range(a.continue_trials):
        n = a.trials + a.stop_trials + m
        if only is not None and n not in only:
            continue
        seed = a.seed + n
        transport, engine = ccombos[m % len(ccombos)]
        r = run_continue_trial(n, seed, transport, engine, a)
        cont.append(r)
        rec = f"{r['recovery']:.3f}s" if r["recovery"] is not None else "-"
        print(f"trial {n:3d} seed {seed} {transport:4s} {engine:6s} continue n={r['size']} victims {r['victims']} "
              f"{r['moment']:11s} rc {r.get('rc')} wall {r['wall']:5.1f}s recovery {rec} "
              f"{'OK' if not r['fails'] else 'FAIL: ' + '; '.join(r['fails'])}", flush=True)
    results += cont
    heal, startup = [], []
    for m in range(a.heal_trials):
        n = a.trials + a.stop_trials + a.continue_trials + m
        if only is not None and n not in only:
            continue
        seed = a.seed + n
        transport, engine = ccombos[m % len(ccombos)]
        r = run_heal_trial(n, seed, transport, engine, a)
        heal.append(r)
        second = f"second {r['second']}:{r['slot2']}+{r['delay']:.3f}s{'' if r['second_landed'] else ' (not landed)'}" \
            if r["second"] else "single"
        took = f"heal {r['heal']:.3f}s" if r["heal"] is not None else "heal -"
        print(f"trial {n:3d} seed {seed} {transport:4s} {engine:6s} heal victim {r['victim']} step {r['step']:2d} "
              f"{second} grow losses {r['grow_losses']} rc {r.get('rc')} wall {r['wall']:5.1f}s {took} "
              f"{'OK' if not r['fails'] else 'FAIL: ' + '; '.join(r['fails'])}", flush=True)
        if a.startup_runs and a.heal_trials and (m * a.startup_runs) // a.heal_trials != \
                ((m + 1) * a.startup_runs) // a.heal_trials:
            startup.extend(startup_alone(1))
    results += heal
    if a.json:
        data = dict(results=results, startup=startup, load=os.getloadavg()) if startup else results
        Path(a.json).write_text(json.dumps(data, indent=1))
    if a.trials + a.stop_trials:
        print(_summary([r for r in results if r["mode"] not in ("continue", "heal")], a))
    if cont:
        print(_summary_continue(cont))
    if heal:
        print(f"heal trials: {sum(not r['fails'] for r in heal)} of {len(heal)} passed")
        times = [r["heal"] for r in heal if r["heal"] is not None and not r["second_landed"]]
        if times:
            print(f"time to heal (one loss): median {np.median(times):.3f} s, worst {max(times):.3f} s "
                  f"({len(times)} trials)")
        if startup:
            print(f"interpreter start-up alone: median {np.median(startup):.3f} s, worst {max(startup):.3f} s "
                  f"({len(startup)} runs)")
    print(f"total time {time.monotonic() - t_start:.0f} s")
    return 1 if any(r["fails"] for r in results) else 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--job":
        sys.exit(job(sys.argv[2]))
    sys.exit(main())
