"""WorkerGroup directly: the pidfd path and the polling fallback (kernels before 5.3)."""

import os
import sys

import pytest

from ndist.launch._workers import WorkerGroup, WorkerSpec

pytestmark = pytest.mark.timeout(60)


def _spec(rank, code, tmp_path):
    return WorkerSpec(rank=rank, local_rank=rank, argv=(sys.executable, "-c", code), env=dict(os.environ),
                      stdout=str(tmp_path / f"out{rank}.log"), error_file=str(tmp_path / f"err{rank}.json"))


@pytest.mark.parametrize("pidfd", [True, False])
def test_group_outcomes(tmp_path, monkeypatch, pidfd):
    if not pidfd:
        def no_pidfd(pid, flags=0):
            raise OSError(38, "Function not implemented")

        monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    ok = WorkerGroup([_spec(r, f"print('r{r}')", tmp_path) for r in range(3)], term_timeout=5)
    ok.start()
    assert all((w.pidfd is not None) == pidfd for w in ok.workers)
    res = ok.monitor()
    assert res.state == "succeeded" and res.failures == []
    assert [(tmp_path / f"out{r}.log").read_text() for r in range(3)] == ["r0\n", "r1\n", "r2\n"]

    bad = WorkerGroup([_spec(0, "import time; time.sleep(60)", tmp_path), _spec(1, "raise SystemExit(9)", tmp_path)],
                      term_timeout=5)
    bad.start()
    res = bad.monitor()
    assert res.state == "failed"
    assert [(f.rank, f.returncode) for f in res.failures] == [(1, 9)]
    assert bad.workers[0].returncode == -15  # stopped with SIGTERM
