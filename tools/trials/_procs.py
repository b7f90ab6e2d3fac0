"""The processes a trial started, found by a token in their environment (every process a
trial starts inherits it): what the trial harnesses beside this file check is left over."""

from __future__ import annotations

import os

__all__ = ["pids_with_env"]


def pids_with_env(var: str, value: str) -> list[int]:
    """Processes (of this user, other than this one) whose environment has ``var=value``."""
    found = []
    needle = f"{var}={value}".encode()
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != os.getpid():
            try:
                with open(f"/proc/{d}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(int(d))
            except OSError:
                pass
    return found
