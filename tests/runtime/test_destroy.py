"""destroy_process_group returns promptly when a peer died, and is bounded when one hangs."""

import os
import re
import socket
import subprocess
import sys

import pytest


def _run_pair(timeout, mode):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))  # a free port, published to both ranks as MASTER_PORT
    port = s.getsockname()[1]
    s.close()
    base = {k: v for k, v in os.environ.items() if k not in ("NDIST_STORE",)}
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", NDIST_SECRET="destroy-test")
    cmd = [sys.executable, "-m", "tests.runtime._peer_death_script", str(timeout), mode]
    p0 = subprocess.Popen(cmd, env=dict(base, RANK="0"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p1 = subprocess.Popen(cmd, env=dict(base, RANK="1"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if mode == "die":
            p1.wait(60)
        out, err = p0.communicate(timeout=60)
    finally:
        for p in (p0, p1):
            p.kill()
            p.wait()
    assert p0.returncode == 0, out + err
    return float(re.search(r"destroy took (\S+)", out).group(1))


@pytest.mark.timeout(90)
def test_destroy_after_peer_died_returns_promptly():
    # timeout 60 s: if destroy waited for the dead peer it would take up to 30 s
    assert _run_pair(60, "die") < 10


@pytest.mark.timeout(90)
def test_destroy_with_a_hung_peer_is_bounded_by_the_timeout():
    assert _run_pair(3, "hang") < 15
