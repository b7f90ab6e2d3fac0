"""Process helpers for the launcher tests (/proc based, no psutil)."""

import socket
import time


def free_port() -> int:
    """A port free on loopback now (a node's ``--master-port``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def wait_dead(pids, timeout: float = 10.0):
    wait_for(lambda: not any(alive(p) for p in pids), timeout, f"processes {pids} to exit")
