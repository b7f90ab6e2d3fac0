"""``benchmarks/call_counts.py`` refuses an unknown op or config, or a ``--keep`` folder that
does not exist, before any worker starts under callgrind (it used to fail inside the worker,
after the earlier counts had run)."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "call_counts.py"


def test_an_unknown_op_or_config_fails_before_any_count():
    for argv, bad in ((["--ops", "broadcast,all_gather"], "all_gather"), (["--configs", "socket3"], "socket3"),
                      (["--keep", str(SCRIPT.parent / "no-such-folder")], "--keep")):
        r = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and bad in r.stderr and "valgrind" not in r.stderr + r.stdout, (argv, r.stderr)
