"""``benchmarks/link_floor.py``: a bare TCP connection's one-way and both-ways times between
2 network namespaces (``link_floor.c``, built into a temporary folder). Checks the shape,
never speed: a row per transfer size (the op sizes and their halves) with positive times,
one line per chunk setting, the op floor table and its cells (each the one-way time of the
op's bytes per direction), and nothing left behind (namespaces, the temporary folder).
Bad arguments fail before anything is built. Needs root, iproute2 and a C compiler; skips
otherwise."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ndist.testing import namespaces

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "link_floor.py"


def _folders() -> set:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "ndist-link-floor-*")))


@pytest.mark.timeout(120)
def test_the_link_floor_reports_every_size_chunk_and_op_and_leaves_nothing():
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("needs root, iproute2 and a C compiler")
    before, folders = namespaces(), _folders()
    r = subprocess.run([sys.executable, str(SCRIPT), "--sizes", "4K,64K", "--iters", "3", "--warmup", "1", "--rounds",
                        "2", "--chunks", "0,1K"], capture_output=True, text=True, timeout=100)
    if r.returncode != 0 and "cannot create a network namespace" in r.stdout + r.stderr:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    transfers = [ln.split() for ln in lines[lines.index("# transfers") + 2:] if ln[:1] == " "][:4]
    assert [int(t[0]) for t in transfers] == [2048, 4096, 32768, 65536], r.stdout
    one_way = {int(t[0]): float(t[1]) for t in transfers}
    assert all(float(x) > 0 for t in transfers for x in t[1:]), r.stdout
    assert [ln.split()[2] for ln in lines if ln.startswith("# chunk ")] == ["0:", "1024:"], r.stdout
    header = next(i for i, ln in enumerate(lines) if ln.startswith("# each op's floor"))
    ops = lines[header + 2].split()[2:]
    assert ops == ["all_reduce", "all_to_all", "all_gather", "reduce_scatter", "broadcast"], r.stdout
    floors = [ln.split() for ln in lines[header + 3:]]
    assert [int(f[0]) for f in floors] == [4096, 65536], r.stdout
    for f in floors:
        size, cells = int(f[0]), list(map(float, f[1:]))
        half = size // 2
        assert cells == [one_way[size], one_way[half], one_way[half], one_way[half], one_way[size]], (f, one_way)
    # the script's own namespaces are gone (others may come and go meanwhile: another worker's netns test)
    used = set(next(ln for ln in lines if ln.startswith("# namespaces (deleted): ")).split(": ", 1)[1].split())
    assert len(used) == 2 and not used & before, (used, before)
    assert not used & namespaces(), used & namespaces()
    assert _folders() <= folders, _folders() - folders


def test_bad_arguments_fail_before_anything_starts():
    for argv, word in ((["--iters", "0"], "iters"), (["--sizes", "4Q"], "--sizes"), (["--chunks", "x"], "--chunks")):
        r = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=30)
        assert r.returncode != 0 and word in r.stderr, (argv, r.stderr)
