"""``benchmarks/multihost.py --compare mpi4py,torch``: ndist, MPICH (mpi4py under Hydra,
launched into the namespaces by a generated ``ip netns exec`` "ssh") and Gloo (torch
under ndistrun), each on 2 network namespaces x 1 rank, a tiny sweep of every op the
benchmark targets. Checks the shape and the checks, never speed: a row for every
library, op and size, every result checked and right, every rank in its host's
namespace, every library's bytes over the host links (not shared memory between the
namespaces), and nothing left behind (namespaces, processes, temp files; the /dev/shm
guard of tests/conftest.py). Needs root, iproute2, mpi4py with MPICH and torch; skips
otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ndist.collectives.backends.socket.native._engine import extension as native_extension
from ndist.testing import namespaces, skip_unless_mpich_hosts

ROOT = Path(__file__).resolve().parents[2]
OPS = ["all_reduce", "all_to_all", "all_gather", "reduce_scatter", "broadcast"]
LIBS = ["ndist[socket]", "mpi4py", "torch"]


def _cmdlines_with(text: str) -> list:
    hits = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        hits.append(int(pid))
            except OSError:
                pass
    return hits


@pytest.mark.torch
@pytest.mark.timeout(150)
def test_compare_mpich_and_gloo_across_two_namespaces(tmp_path):
    skip_unless_mpich_hosts(pytest.skip, "torch")
    out = tmp_path / "out.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "multihost.py"), "--compare", "mpi4py,torch",
                        "--hosts", "2", "--per-host", "1", "--sizes", "4K,64K", "--iters", "3", "--warmup", "1",
                        "--rounds", "2", "--timeout", "60", "--congestion", "reno", "--json", str(out)],
                       capture_output=True, text=True, timeout=130)
    if r.returncode != 0 and "cannot create a network namespace" in r.stdout + r.stderr:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    cells = {(x["lib"], x["op"], x["size"]): x for x in doc["results"]}
    assert set(cells) == {(lib, op, size) for lib in LIBS for op in OPS for size in (4096, 65536)}
    assert all(x["wrong"] == 0 for x in cells.values()), [x for x in cells.values() if x["wrong"]]
    assert all(len(x["samples_us"]) == 2 for x in cells.values())
    ns = doc["hosts"]["namespaces"]
    for lib in LIBS:
        ranks = doc["libraries"][lib]["ranks"]
        assert {k: v["netns"] for k, v in ranks.items()} == {"0": ns[0], "1": ns[1]}, lib
        moved = doc["link_bytes"][lib]
        assert moved["link"] >= 0.25 * moved["buffers"] > 0, (lib, moved)  # over the veth, not shared memory
        segs = doc["tcp_segments"][lib]  # counted in the hosts' stacks during its calls
        assert segs["sent"] > 0 and 0 <= segs["retransmitted"] <= segs["sent"], (lib, segs)
    assert doc["hosts"]["congestion"].startswith("reno (route congctl"), doc["hosts"]
    # the header names the engine that ran, asked after a collective: the native engine over TCP, the
    # default for a group whose peers are on other hosts (the Python engine where it is not built)
    engine = "native" if native_extension() is not None else "python"
    assert doc["libraries"]["ndist[socket]"]["versions"]["engine"] == engine, doc["libraries"]["ndist[socket]"]
    mpich = doc["libraries"]["mpi4py"]["launch"]
    assert "-launcher-exec" in mpich and "UCX_TLS" in mpich and "tcp,self" in mpich
    # the table: one row per size under every op, with both ratios
    text = r.stdout
    assert "TCP congestion control reno (route congctl" in text.splitlines()[0]
    assert text.count("TCP retransmitted ") == len(LIBS)
    assert "ndist/MPICH" in text and "ndist/Gloo" in text and "# checked: 30 cells, 0 wrong elements" in text
    for op in OPS:
        lines = text.split(f"# {op}\n", 1)[1].splitlines()
        assert lines[0].split()[1:] == ["bytes", "ndist", "MPICH", "Gloo", "ndist/MPICH", "ndist/Gloo", "wrong"], op
        rows = [ln.split() for ln in lines[1:3]]
        assert [x[0] for x in rows] == ["4096", "65536"] and all(len(x) == 7 for x in rows), (op, lines)
    # nothing left: namespaces, the temp folder (ssh script, sockets), processes that used it
    tmp = Path(mpich[mpich.index("-launcher-exec") + 1]).parent
    assert not tmp.exists()
    assert _cmdlines_with(str(tmp)) == []
    assert not set(ns) & namespaces()
