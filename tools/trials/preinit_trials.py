"""Randomized trials of a rank lost before it joins ``init_process_group`` (issue 44, part 1).

    python tools/trials/preinit_trials.py [--trials 50] [--seed 0] [--modes stop-exit0,stop-kill,...]
                                        [--sizes 4] [--max-latency 1.0] [--json out.json]

Each trial starts ``ndistrun --nproc-per-node n --on-failure stop|continue`` on this file
(``--job``). A random rank (the victim) waits until every other rank waits in
``init_process_group`` (their claims are in the job's store), then a random 0-0.3 s more,
and ends: exit 0 or SIGKILL, recording the wall-clock time first. The others call
``init_process_group`` and record what it raised and when. Modes: ``stop-exit0``,
``stop-kill``, ``continue-exit0``, ``continue-kill``, all run ``--trials`` times each, in turn.

Counted per trial (any one fails it):
  hang       the launcher did not end within ``--hard-timeout``
  survivor   (continue, and stop-exit0: the others' error is what ends the job) a recorded
             error is not a ``DistRankFailureError`` with ``failed_ranks == [victim]``
             and the cause (``exited`` / ``died``); with continue every survivor must record one
  launcher   its exit status is not the victim's (1 for exit 0, 137 for SIGKILL), or its
             summary's root cause is not the victim "before it joined the group"
  late       the loss -> the launcher's end longer than ``--max-latency`` (the name is in its
             summary then; with continue, also each survivor's raise)
  files      files of the job left in /dev/shm (found by the job's secret)
  procs      processes of the trial alive after the launcher exits

Prints one line per trial and a table per mode: trials passed, and the latency's median and
worst. Exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from _procs import pids_with_env  # tools/trials/_procs.py, beside this script (sys.path[0])

HERE = Path(__file__).resolve().parent
TOKEN_ENV = "NDIST_PREINIT_TRIAL_TOKEN"
MODES = ("stop-exit0", "stop-kill", "continue-exit0", "continue-kill")


# ---------------------------------------------------------------- the rank's side

def _put(out: Path, name: str, value) -> None:
    (out / (name + ".tmp")).write_text(json.dumps(value))
    os.replace(out / (name + ".tmp"), out / name)


def job(spec_path: str) -> int:
    """One rank of a trial (run by ndistrun)."""
    spec = json.loads(Path(spec_path).read_text())
    out, victim = Path(spec["out"]), spec["victim"]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    _put(out, f"pid{rank}", os.getpid())
    if rank == victim:
        _put(out, "secret", os.environ["NDIST_SECRET"])
        from ndist.runtime._ended import JOIN_NAMESPACE, job_namespace
        from ndist.runtime.store import TCPStore

        host, _, port = os.environ["NDIST_STORE"].rpartition(":")
        join = f"{job_namespace(int(os.environ['NDIST_RESTART_COUNT']), 0)}/{JOIN_NAMESPACE}"
        TCPStore(host, int(port), timeout=60).wait([f"{join}/rank/{r}" for r in range(world) if r != rank])
        time.sleep(spec["delay"])
        _put(out, "lost", time.time())
        if spec["how"] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        return 0
    import ndist.distributed as dist

    try:
        dist.init_process_group("socket", timeout=spec["init_timeout"])
    except dist.DistError as err:
        _put(out, f"r{rank}", {"t": time.time(), "type": type(err).__name__, "msg": str(err)[:2000],
                               "failed_ranks": getattr(err, "failed_ranks", None),
                               "causes": getattr(err, "causes", None)})
        return 1
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------- the harness

def _token_pids(token: str) -> list[int]:
    """Processes (of this user) whose environment carries the trial's token."""
    return pids_with_env(TOKEN_ENV, token)


def run_trial(mode: str, n: int, seed: int, a) -> dict:
    import numpy as np

    from ndist.runtime._shmfiles import SHM_DIR, job_prefix

    on_failure, how = mode.split("-")
    rng = np.random.default_rng([seed, 44])
    victim = int(rng.integers(n))
    delay = float(rng.uniform(0, 0.3))
    res = dict(mode=mode, size=n, seed=seed, victim=victim, fails=[], latency=None, raised=None, ended=None)
    token = uuid.uuid4().hex
    with tempfile.TemporaryDirectory(prefix="ndist-preinit-") as d:
        out = Path(d)
        (out / "spec.json").write_text(json.dumps(dict(out=d, victim=victim, how=how, delay=delay,
                                                       init_timeout=a.hard_timeout * 2)))
        env = dict(os.environ, **{TOKEN_ENV: token})
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", "ndist.launch", "--nproc-per-node", str(n), "--on-failure", on_failure,
               __file__, "--job", str(out / "spec.json")]
        with open(out / "log", "w+") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            try:
                proc.wait(timeout=a.hard_timeout)
            except subprocess.TimeoutExpired:
                res["fails"].append("hang")
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            ended = time.time()
            time.sleep(0.2)
            left = _token_pids(token)
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if left:
                res["fails"].append(f"procs: {len(left)} left")
            log.seek(0)
            text = log.read()
        lost = json.loads((out / "lost").read_text()) if (out / "lost").exists() else None
        if lost is None:
            res["fails"].append("the victim did not end")
            return res
        res["latency"] = res["ended"] = ended - lost
        cause = "exited" if how == "exit0" else "died"
        recs = {r: json.loads((out / f"r{r}").read_text()) for r in range(n) if (out / f"r{r}").exists()}
        if on_failure == "continue" and len(recs) != n - 1:
            res["fails"].append(f"survivor: {n - 1 - len(recs)} recorded no error")
        if on_failure == "stop" and how == "exit0" and not recs:
            res["fails"].append("survivor: none recorded an error")
        for r, rec in recs.items():
            if (rec["type"], rec["failed_ranks"], rec["causes"]) != ("DistRankFailureError", [victim], [cause]):
                res["fails"].append(f"survivor: rank {r} raised {rec['type']}: {rec['msg'][:200]}")
            else:
                res["raised"] = max(res["raised"] or 0.0, rec["t"] - lost)
                if on_failure == "continue":
                    res["latency"] = max(res["latency"], rec["t"] - lost)
        status = 1 if how == "exit0" else 128 + signal.SIGKILL
        said = "exit code 0" if how == "exit0" else "killed by SIGKILL (exit status 137)"
        root = f"root cause (first rank to fail):\n  rank       : {victim} (local rank {victim})"
        if proc.returncode != status or root not in text or f"{said}, before it joined the group" not in text:
            res["fails"].append(f"launcher: exit status {proc.returncode}, the summary does not name rank {victim}")
        if res["latency"] > a.max_latency:
            res["fails"].append(f"late: {res['latency']:.3f} s")
        secret = json.loads((out / "secret").read_text())
        leaked = sorted(glob.glob(os.path.join(SHM_DIR, job_prefix(secret) + "*")))
        if leaked:
            res["fails"].append(f"files: {len(leaked)} in /dev/shm")
            for f in leaked:
                os.unlink(f)
        if res["fails"]:
            res["log"] = text[-4000:]
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=50, help="trials per mode")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--sizes", default="4", help="ranks per trial, drawn in turn")
    p.add_argument("--max-latency", type=float, default=1.0)
    p.add_argument("--hard-timeout", type=float, default=60.0)
    p.add_argument("--json", default=None)
    p.add_argument("--job", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.job:
        return job(a.job)
    modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        p.error(f"--modes: expected some of {','.join(MODES)}, got {bad}")
    sizes = [int(s) for s in a.sizes.split(",")]
    results = []
    for i in range(a.trials):
        for mode in modes:
            seed, n = a.seed + i, sizes[i % len(sizes)]
            res = run_trial(mode, n, seed, a)
            results.append(res)
            lat = f"{res['latency']:.3f} s" if res["latency"] is not None else "-"
            print(f"{mode:15s} n={n} seed={seed} victim={res['victim']} {lat} {'; '.join(res['fails']) or 'ok'}",
                  flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    print("\n| mode | n | trials | passed | latency median | worst | last raise median / worst | launcher end "
          "median / worst |\n|---|---|---|---|---|---|---|---|")
    for mode in modes:
        for n in sizes:
            rs = [r for r in results if r["mode"] == mode and r["size"] == n]
            lats = [r["latency"] for r in rs if r["latency"] is not None]
            ok = sum(1 for r in rs if not r["fails"])
            med = f"{statistics.median(lats):.3f} s" if lats else "-"
            worst = f"{max(lats):.3f} s" if lats else "-"
            parts = []
            for key in ("raised", "ended"):
                xs = [r[key] for r in rs if r.get(key) is not None]
                parts.append(f"{statistics.median(xs):.3f} / {max(xs):.3f} s" if xs else "-")
            print(f"| {mode} | {n} | {len(rs)} | {ok} | {med} | {worst} | {parts[0]} | {parts[1]} |")
    return 1 if any(r["fails"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
