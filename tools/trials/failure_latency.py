"""How long survivors take to see a peer killed mid all_to_all, under ndistrun.

    python tools/trials/failure_latency.py [--runs 5] [--ranks 4] [--transport tcp]

Each run starts ``ndistrun --nproc-per-node RANKS``; rank 2 kills itself with
SIGKILL after 30 rounds of ``all_to_all_single``; every survivor records when
it got its ``DistNetworkError`` and which rank it named. Prints, per run, the
slowest survivor's latency and the launcher's exit code and wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

JOB = """
import json, os, signal, sys, time
import numpy as np
import ndist.distributed as dist

out = sys.argv[1]
signal.signal(signal.SIGTERM, lambda *a: None)
dist.init_process_group("socket")
rank, size = dist.get_rank(), dist.get_world_size()
x = np.arange(4096 * size, dtype=np.float32)
y = np.empty_like(x)
for i in range(100000):
    if rank == 2 and i == 30:
        with open(os.path.join(out, "killed"), "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        dist.all_to_all_single(y, x)
    except dist.DistError as err:
        with open(os.path.join(out, f"r{rank}.json"), "w") as f:
            json.dump({"t": time.time(), "peer": err.rank if isinstance(err, dist.DistNetworkError) else None,
                       "host": getattr(err, "host", None), "error": f"{type(err).__name__}: {err}"}, f)
        # stay until every survivor has reported: a survivor that exits at once resets its
        # connections, and a slower survivor may then see that rank vanish first
        deadline = time.time() + 10
        while time.time() < deadline and len([n for n in os.listdir(out) if n.startswith("r")]) < size - 1:
            time.sleep(0.01)
        sys.exit(3)
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--transport", default="tcp", choices=("tcp", "shm", "auto"))
    a = ap.parse_args(argv)
    root = Path(__file__).resolve().parents[2]  # the checkout: tools/trials/ is two below it
    worst_all, bad = [], 0
    for run in range(a.runs):
        with tempfile.TemporaryDirectory() as d:
            job = Path(d) / "job.py"
            job.write_text(textwrap.dedent(JOB))
            env = dict(os.environ, NDIST_TRANSPORT=a.transport,
                       PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
            t0 = time.monotonic()
            r = subprocess.run([sys.executable, "-m", "ndist.launch", "--nproc-per-node", str(a.ranks),
                                "--term-timeout", "20", str(job), d], capture_output=True, text=True, env=env,
                               timeout=300)
            wall = time.monotonic() - t0
            killed = float((Path(d) / "killed").read_text())
            recs = [json.loads((Path(d) / f"r{q}.json").read_text()) for q in range(a.ranks) if q != 2
                    if (Path(d) / f"r{q}.json").exists()]
            ok = len(recs) == a.ranks - 1 and all(x["peer"] == 2 for x in recs) and r.returncode != 0
            bad += not ok
            worst = max(x["t"] for x in recs) - killed if recs else float("nan")
            worst_all.append(worst)
            named = sum(x["peer"] == 2 for x in recs)
            print(f"run {run}: {named}/{a.ranks - 1} survivors named rank 2; slowest after {worst * 1000:.0f} ms; "
                  f"ndistrun exit {r.returncode}, wall {wall:.1f} s")
            for x in recs:
                if x["peer"] != 2:
                    print(f"    unexpected: {x['error'][:400]}")
    print(f"runs={a.runs} transport={a.transport} failures={bad} worst={max(worst_all) * 1000:.0f} ms "
          f"median={sorted(worst_all)[len(worst_all) // 2] * 1000:.0f} ms hangs=0")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
