"""benchmarks/placement.py (docs/performance.md, "Bimodal rounds"): each round of ndist's
ranks comes with the CPU each rank ran on, from ndist.bench's public names; ranks under
``ndistrun --bind-to core`` report CPUs of their own, ranks started on one CPU share it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "placement.py"
CPUS = sorted(os.sched_getaffinity(0))


@pytest.mark.skipif(len(CPUS) < 2 or shutil.which("taskset") is None, reason="needs 2 usable CPUs and taskset")
def test_rounds_report_where_each_rank_ran():
    r = subprocess.run([sys.executable, str(SCRIPT), "--placements", "core,one-cpu", "--compare", "none",
                        "--rounds", "2", "--iters", "20", "--warmup", "5", "--size", "1K"],
                       capture_output=True, text=True, timeout=100)
    assert r.returncode == 0, r.stdout + r.stderr
    rounds = re.findall(r"^(core|one-cpu) +(\d) ndist +([0-9.]+) +((?:\d+>\d+ +)+)(one CPU)?", r.stdout, re.M)
    assert [(p, n) for p, n, *_ in rounds] == [("core", "0"), ("core", "1"), ("one-cpu", "0"), ("one-cpu", "1")]
    for placement, _, us, cpus, one in rounds:
        per_rank = [tuple(map(int, c.split(">"))) for c in cpus.split()]
        assert float(us) > 0 and len(per_rank) == 2
        if placement == "core":  # bound by ndistrun: each rank on a CPU of its own, before and after
            assert per_rank[0][0] == per_rank[0][1] != per_rank[1][0] == per_rank[1][1] and not one
        else:
            assert {c for pair in per_rank for c in pair} == {CPUS[0]} and one
    assert re.search(r"^# core: masks \[\(\d+,\), \(\d+,\)\]; 0 rounds with every rank on one CPU", r.stdout, re.M)
    assert f"# one-cpu: masks [({CPUS[0]},)]; 2 rounds with every rank on one CPU" in r.stdout


def test_a_bad_placement_is_refused():
    r = subprocess.run([sys.executable, str(SCRIPT), "--placements", "core,socket"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "--placements" in r.stderr and "'socket'" in r.stderr
