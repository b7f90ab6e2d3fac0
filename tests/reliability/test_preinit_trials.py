"""tools/trials/preinit_trials.py keeps working: one trial of each mode (a rank of 4 lost before
it joins ``init_process_group``: exit 0 or SIGKILL, ``--on-failure`` stop or continue) under
ndistrun. Checked there: no hang, the survivors' ``DistRankFailureError`` naming the rank, the
launcher's status and summary, no process or /dev/shm file left. The latency bound is loose
here (a loaded machine); the harness's default is 1 s."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[2] / "tools" / "trials" / "preinit_trials.py"


@pytest.mark.timeout(240)
def test_one_trial_per_mode_names_the_rank(tmp_path):
    out = tmp_path / "trials.json"
    r = subprocess.run([sys.executable, str(HARNESS), "--trials", "1", "--seed", "3", "--max-latency", "10",
                        "--hard-timeout", "50", "--json", str(out)], capture_output=True, text=True, timeout=230)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    results = json.loads(out.read_text())
    assert [x["mode"] for x in results] == ["stop-exit0", "stop-kill", "continue-exit0", "continue-kill"]
    assert all(x["fails"] == [] and x["latency"] < 10 for x in results), results
    assert "| continue-kill | 4 | 1 | 1 |" in r.stdout, r.stdout
