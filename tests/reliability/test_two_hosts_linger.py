"""After the link between two hosts is cut, neither launcher outlives its failed
ranks by more than a few seconds, even with the default --rdzv-timeout of 600 s
(issue 14, item 8). Two network namespaces, as in test_two_hosts_netns.py (root
and iproute2 needed; skipped otherwise)."""

import subprocess
import time

import pytest

from ndist.testing import outputs
from tests.reliability.two_hosts import cut, ready, start, stop, two_hosts  # noqa: F401 - the fixture


@pytest.mark.timeout(240)
def test_both_launchers_exit_soon_after_their_ranks_fail_on_a_cut_link(two_hosts, tmp_path):  # noqa: F811
    launchers = start(two_hosts, tmp_path, 1, "--term-timeout", "5")  # --rdzv-timeout: the default, 600 s
    try:
        ready(tmp_path, 2, launchers)
        cut_at = time.monotonic()
        cut(two_hosts)
        took = []
        for p in launchers:
            try:
                p.wait(timeout=max(1.0, 120 - (time.monotonic() - cut_at)))
                took.append(time.monotonic() - cut_at)
            except subprocess.TimeoutExpired:
                took.append(None)
    finally:
        stop(launchers)
    errs = [o[1][-3000:] for o in outputs(tmp_path, 2)]
    assert None not in took, (took, errs)
    # ranks: the group timeout (5 s); then node 0: --term-timeout + 10 s; node 1: 15 s to give up on the store
    assert all(t < 40 for t in took), (took, errs)
    assert all(p.returncode != 0 for p in launchers), errs
