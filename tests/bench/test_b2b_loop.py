"""benchmarks/b2b_loop.py (docs/performance.md's back-to-back figures): it runs on real
ranks under ndistrun and prints one line per op; a bad op or side is refused."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "b2b_loop.py"


def test_prints_each_op_per_call_on_two_ranks():
    r = subprocess.run([sys.executable, "-m", "ndist.launch", "--nproc-per-node", "2", str(SCRIPT), "ndist",
                        "ar,a2a,bc,bar", "50"], capture_output=True, text=True, timeout=100)
    assert r.returncode == 0, r.stderr
    lines = re.findall(r"ndist\[(native|python)\] (ar|a2a|bc|bar) n=2 ([0-9.]+) us/call", r.stdout)
    assert [op for _, op, _ in lines] == ["ar", "a2a", "bc", "bar"], r.stdout
    assert all(float(us) > 0 for _, _, us in lines)


@pytest.mark.parametrize("argv, message", [(["gloo", "ar"], "side: expected 'ndist' or 'mpi4py', got 'gloo'")])
def test_a_bad_side_is_refused(argv, message):
    r = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and message in r.stderr
