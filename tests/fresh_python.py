"""A fresh interpreter, for a test about what a process imports or loads on its own."""

from __future__ import annotations

import subprocess
import sys


def prints(code: str, timeout: float | None = None) -> str:
    """What ``python -c code`` prints (stripped); fails the test, with its stderr, when it
    exits non-zero."""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()
