"""Who this process is, as its peers compare it: the host it runs on (a kernel and a
loopback interface shared) and its pid namespace (two pids compare only within one).
The mesh publishes both (``_tcp``); the record of dead processes compares them
(``failure/_losses``)."""

from __future__ import annotations

import os
import socket

__all__ = ["host_identity", "pid_namespace"]


def host_identity() -> str:
    """hostname + boot id + network namespace: equal exactly when two processes share
    a kernel (so /dev/shm) and a loopback interface (so 127.0.0.1 reaches the peer).
    Ranks in different network namespaces of one machine (containers, ``ip netns``)
    count as different hosts."""
    boot = ""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        pass
    try:
        netns = os.readlink("/proc/self/ns/net")
    except OSError:
        netns = ""
    return f"{socket.gethostname()}/{boot}/{netns}"


def pid_namespace() -> str:
    """This process's pid namespace (two pids compare only within one)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
