"""ndist-bench binds ndist's ranks (its own API, and torch on backend "ndist") as ndistrun does
(--bind-to core|core:overload-allowed|none); the other libraries run unbound, as their launchers' defaults do."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

CPUS = sorted(os.sched_getaffinity(0))


def _bench(*args):
    return subprocess.run([sys.executable, "-m", "ndist.bench", "all_reduce", "-b", "1K", "-e", "1K", "-n", "3",
                           "-w", "1", "-q", *args], capture_output=True, text=True, timeout=100)


def _ranks(out: str, lib: str = "ndist[socket]") -> dict:
    return {int(r): [int(c) for c in cpus.split(",")]
            for r, cpus in re.findall(rf"^#  {re.escape(lib)} +Rank +(\d+) Pid +\d+ on \S+ CPUs ([\d,]+)$", out, re.M)}


@pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 usable CPUs")
@pytest.mark.parametrize("args", [(), ("--bind-to", "none")])
def test_ndist_ranks_are_bound_by_default(args):
    r = _bench(*args)
    assert r.returncode == 0, r.stderr
    ranks = _ranks(r.stdout)
    assert sorted(ranks) == [0, 1], r.stdout
    if args:
        assert ranks[0] == ranks[1] == CPUS and "ndist's ranks: --bind-to none (unbound)" in r.stdout
    else:
        assert ranks[0] and ranks[1] and not set(ranks[0]) & set(ranks[1])
        assert set(ranks[0]) | set(ranks[1]) <= set(CPUS) and "ndist's ranks: --bind-to core (CPUs of their own)" in r.stdout


@pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 usable CPUs")
def test_overload_allowed_shares_cpus_and_the_report_says_so():
    n = len(CPUS) + 1
    r = _bench("--nproc", str(n), "--bind-to", "core:overload-allowed")
    assert r.returncode == 0, r.stderr
    ranks = _ranks(r.stdout)
    assert sorted(ranks) == list(range(n)) and all(len(c) == 1 for c in ranks.values()), r.stdout
    load = [sum(c == [cpu] for c in ranks.values()) for cpu in CPUS]
    assert max(load) - min(load) <= 1, r.stdout
    assert "ndist's ranks: --bind-to core:overload-allowed (one CPU each, shared evenly)" in r.stdout


@pytest.mark.torch
@pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 usable CPUs")
def test_torch_on_ndist_is_placed_as_ndist_and_gloo_is_not():
    pytest.importorskip("torch")
    r = _bench("--compare", "torch,torch:ndist-python")
    assert r.returncode == 0, r.stderr
    ours, gloo = _ranks(r.stdout, "torch:ndist-python"), _ranks(r.stdout, "torch")
    assert sorted(ours) == sorted(gloo) == [0, 1], r.stdout
    assert ours[0] and ours[1] and not set(ours[0]) & set(ours[1]), r.stdout
    assert gloo[0] == gloo[1] == CPUS, r.stdout


@pytest.mark.parametrize("args, words", [
    (("--bind-to", "socket"), ["--bind-to", "'core', 'core:N'", "'none'", "'socket'"]),
    (("--bind-to", "core", "--nproc", str(len(CPUS) + 1)), ["--bind-to core", f"(--nproc {len(CPUS) + 1})"]),
])
def test_bad_bind_to_is_refused_before_any_rank(args, words):
    r = _bench(*args)
    assert r.returncode == 2 and all(w in r.stderr for w in words), r.stderr
    assert "Using ranks" not in r.stdout
