"""The two benchmarks tools/gpu_check.sh runs on the GPU, run here as far as a CPU allows.

* ``benchmarks/staging_overhead.py --device numpy``: the very same ranks, staging backend
  and checks, with NumPy in the device role (``HostArrays``), at 2 real rank processes;
* both benchmarks without CuPy: one ``skipped:`` line and exit 0 (what gpu_check.sh
  counts as a failure on a GPU machine).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HAVE_CUPY = importlib.util.find_spec("cupy") is not None


def _run(*args, timeout=120):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=ROOT)


@pytest.mark.timeout(180)
def test_staging_benchmark_runs_and_checks_with_numpy_as_the_device(tmp_path):
    out = tmp_path / "staging.json"
    proc = _run("benchmarks/staging_overhead.py", "--device", "numpy", "--sizes", "4K,64K", "--iters", "2",
                "--warmup", "1", "--timeout", "90", "--json", str(out), timeout=150)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("# socket all_reduce, 2 ranks, float32, device numpy")
    assert lines[-1] == "# OK"
    data = json.loads(out.read_text())
    assert (data["device"], data["nproc"]) == ("numpy", 2)
    assert [r["bytes"] for r in data["rows"]] == [4096, 65536]
    for row in data["rows"]:
        assert row["ok"] is True
        assert all(row[k] > 0 for k in ("host_s", "staged_s", "d2h_s", "h2d_s", "staged_over_floor"))


@pytest.mark.skipif(HAVE_CUPY, reason="CuPy is installed: the benchmarks would run")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("script", ["benchmarks/nccl_overhead.py", "benchmarks/nccl_graph.py",
                                    "benchmarks/staging_overhead.py"])
def test_without_cupy_a_benchmark_says_skipped_and_exits_0(script, tmp_path):
    proc = _run(script, "--json", str(tmp_path / "x.json"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["skipped: CuPy is not installed (No module named 'cupy')"]
    assert not (tmp_path / "x.json").exists()
