"""Once all of a node's ranks have failed, its launcher exits within the group
timeout plus a few seconds, whatever --rdzv-timeout says (issue 14, item 8)."""

import signal
import time

import pytest

pytestmark = pytest.mark.timeout(120)

JOB = """
import os, sys, time
from datetime import timedelta
import numpy as np
import ndist.distributed as dist

dist.init_process_group("socket", timeout=timedelta(seconds=5))
rank = dist.get_rank()
dist.all_reduce(np.ones(4))
open(f"up-{rank}", "w").close()
while True:
    dist.all_reduce(np.ones(4))
    time.sleep(0.01)
"""


def test_node_0_does_not_wait_the_rendezvous_timeout_for_a_dead_node(launcher):
    launcher.script(JOB)
    n0, n1 = launcher.nodes("--nproc-per-node", 1, "--term-timeout", 2, rdzv_timeout=300, to_kill=(1,))
    try:
        launcher.wait_files("up-", (0, 1), 60, "both nodes' ranks")
        killed = time.monotonic()
        n1.send_signal(signal.SIGKILL)  # node 1's launcher, and (PR_SET_PDEATHSIG) its rank, are gone
        try:
            _, err0 = n0.communicate(timeout=60)
        except Exception:  # noqa: BLE001
            n0.kill()
            _, err0 = n0.communicate()
            pytest.fail(f"node 0's launcher was still running 60 s after node 1 died: {err0[-3000:]}")
        took = time.monotonic() - killed
    finally:
        for p in (n0, n1):
            if p.poll() is None:
                p.kill()
            p.communicate()
    assert n0.returncode == 1, err0[-3000:]  # rank 0 lost rank 1: its error ends the job
    assert "rank       : 0" in err0, err0[-3000:]
    # rank 0 fails at once (connection reset); node 1's agent has no connection to the store any
    # more, so node 0 does not wait for its report (~1 s; at worst --term-timeout + 10 s)
    assert took < 10, (took, err0[-3000:])
