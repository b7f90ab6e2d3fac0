"""Real tiny runs of ndist-bench: real rank processes, real MPI / Gloo / ndist.

Nothing here asserts speed: only the shape of the output and that every result
was checked and right.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from ndist.bench import BenchError, main, parse_args, run_bench
from ndist.bench._launch import RankGroup, find_mpiexec, hydra_files, hydra_files_left
from tests.bench.bench_output import table

HAVE_MPI = importlib.util.find_spec("mpi4py") is not None and find_mpiexec() is not None
HAVE_TORCH = importlib.util.find_spec("torch") is not None


def _ndist_ready() -> bool:
    try:
        import ndist.distributed as d
    except ImportError:
        return False
    return all(hasattr(d, n) for n in ("init_process_group", "all_reduce", "TCPStore", "all_to_all_single"))


def _ndist_mpi_ready() -> bool:
    if not (_ndist_ready() and HAVE_MPI):
        return False
    from ndist.runtime import registered_backends

    return "mpi" in registered_backends()


LIBS = [
    pytest.param(("--backend", "none", "--compare", "mpi4py"), "mpi4py",
                 marks=pytest.mark.skipif(not HAVE_MPI, reason="mpi4py / mpiexec not installed")),
    pytest.param(("--backend", "none", "--compare", "torch"), "torch",
                 marks=pytest.mark.skipif(not HAVE_TORCH, reason="torch not installed")),
    pytest.param(("--backend", "socket"), "ndist[socket]",
                 marks=pytest.mark.skipif(not _ndist_ready(), reason="ndist.distributed not in this checkout yet")),
    pytest.param(("--backend", "mpi"), "ndist[mpi]",
                 marks=pytest.mark.skipif(not _ndist_mpi_ready(), reason="ndist's mpi backend not in this checkout")),
]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("flags, lib", LIBS)
def test_tiny_run_every_library(flags, lib, capsys):
    rc = main(["all_reduce", "-b", "8", "-e", "1K", "-n", "2", "-w", "1", "--nproc", "2", "-q", *flags])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = table(out, lib, "all_reduce")
    assert [int(r[0]) for r in rows] == [8, 16, 32, 64, 128, 256, 512, 1024]
    for r in rows:
        assert len(r) == 9
        size, count, typ, redop, root, time_us, algbw, busbw, wrong = r
        assert int(count) == int(size) // 4 and typ == "float32" and redop == "sum" and root == "-1"
        assert float(time_us) > 0 and float(algbw) >= 0 and float(busbw) >= 0
        assert wrong == "0"
    assert "# Wrong values         : 0 OK" in out
    assert "# Avg bus bandwidth    :" in out
    assert f"#  {lib}" in out  # the header names the library and its versions
    assert "# load average (1/5/15 min): " in out


@pytest.mark.timeout(180)
@pytest.mark.parametrize("flags, lib", LIBS)
def test_integer_avg_truncates_on_every_library(flags, lib):
    """AVG on int32 at 3 ranks: each library's result (ndist's AVG; SUM then a truncating divide
    where there is no AVG) is checked against the sum divided with truncation (a sum that 3
    does not divide shows the rounding)."""
    res = run_bench(parse_args(["all_reduce", "reduce", "-b", "12", "-e", "3K", "-f", "16", "-n", "2", "-w", "1",
                                "--nproc", "3", "-r", "1", "-o", "avg", "-d", "int32", *flags]))
    rows = [r for r in res.rows if r.lib == lib]
    assert {r.op for r in rows} == {"all_reduce", "reduce"} and len(rows) == 6, res.rows
    assert all(r.wrong == 0 and r.redop == "avg" for r in rows), rows


@pytest.mark.timeout(240)
@pytest.mark.skipif(not HAVE_MPI, reason="mpi4py / mpiexec not installed")
def test_every_op_checks_out_on_mpi4py():
    cfg = parse_args("all -b 96 -e 6K -f 8 -n 2 -w 1 --nproc 3 -r 1 -d int32 -o max --backend none "
                     "--compare mpi4py".split())
    res = run_bench(cfg)
    assert {r.op for r in res.rows} == set(cfg.ops)
    for r in res.rows:
        assert r.wrong == 0, r
        assert r.root == (1 if r.op in ("broadcast", "reduce", "gather", "scatter") else -1)
    # nccl-tests' size column: 96 B of int32 on 3 ranks is 8 elements each for the split ops
    ag = res.rows_for("mpi4py", "all_gather")[0]
    assert (ag.size, ag.count) == (96, 8)
    assert [len(res.rows_for("mpi4py", op)) for op in ("all_reduce", "barrier")] == [3, 1]  # barrier: one row


@pytest.mark.timeout(300)
@pytest.mark.skipif(not (HAVE_MPI and HAVE_TORCH), reason="needs mpi4py and torch")
def test_compare_alternates_and_writes_json_and_ratios(tmp_path, capsys):
    jpath = tmp_path / "out.json"
    argv = ["all_to_all", "-b", "1K", "-e", "4K", "-n", "2", "-w", "1", "--nproc", "2", "--rounds", "2", "-q",
            "--backend", "none", "--compare", "mpi4py,torch", "--json", str(jpath)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "# Ratios for all_to_all" in out and "mpi4py/torch" in out
    doc = json.loads(jpath.read_text())
    assert doc["command"] == ["ndist-bench", *argv]
    assert doc["config"]["nproc"] == 2 and doc["machine"]["cores"] == os.cpu_count()
    assert doc["libraries"]["torch"]["versions"]["torch"]
    assert doc["libraries"]["mpi4py"]["launch"][0].endswith("mpiexec")
    res = doc["results"]
    assert [(r["lib"], r["size"]) for r in res] == [(lib, s) for s in (1024, 2048, 4096) for lib in ("mpi4py", "torch")]
    for r in res:
        assert r["wrong"] == 0 and len(r["samples_us"]) == 2
    ratios = doc["ratios"]["all_to_all"]
    mpi, torch = res[0], res[1]
    assert ratios[0]["mpi4py/torch"]["busbw"] == pytest.approx(mpi["busbw"] / torch["busbw"])
    assert ratios[0]["mpi4py/torch"]["time"] == pytest.approx(mpi["time_us"] / torch["time_us"])


@pytest.mark.timeout(300)
@pytest.mark.skipif(not (HAVE_MPI and HAVE_TORCH), reason="needs mpi4py and torch")
def test_schedule_alternates_libraries():
    cfg = parse_args("broadcast -b 64 -e 256 -n 1 -w 0 -c 0 --nproc 2 --rounds 2 --backend none "
                     "--compare mpi4py,torch".split())
    res = run_bench(cfg)
    assert len(res.schedule) == 3 * 2 * 2
    for size in (64, 128, 256):
        runs = [lib for op, s, rnd, lib in res.schedule if s == size]
        assert sorted(runs) == ["mpi4py", "mpi4py", "torch", "torch"]
        assert runs[0] != runs[1] and runs[2] != runs[3]  # each round measures every library once
    firsts = [res.schedule[i][3] for i in range(0, len(res.schedule), 2)]
    assert firsts == ["mpi4py", "torch"] * 3  # who goes first rotates
    assert all(r.wrong == -1 for r in res.rows)  # -c 0: nothing checked


@pytest.mark.timeout(120)
@pytest.mark.skipif(not HAVE_MPI, reason="mpi4py / mpiexec not installed")
def test_module_entry_point_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "bw.png"
    env = dict(os.environ)
    p = subprocess.run(
        [sys.executable, "-m", "ndist.bench", "reduce_scatter", "barrier", "-b", "64", "-e", "256", "-n", "2", "-w", "1",
         "--nproc", "2", "--backend", "none", "--compare", "mpi4py", "--plot", str(png)],
        capture_output=True, text=True, env=env, timeout=100,
    )
    assert p.returncode == 0, p.stderr
    assert "# reduce_scatter -- mpi4py -- nproc 2" in p.stdout and "# barrier -- mpi4py -- nproc 2" in p.stdout
    assert "# reduce_scatter mpi4py" in p.stderr  # progress lines
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(60)
def test_missing_library_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    import ndist.bench._runner as runner

    monkeypatch.setattr(runner, "find_mpiexec", lambda: None)
    assert main(["all_reduce", "-b", "8", "-e", "8", "--backend", "none", "--compare", "mpi4py"]) == 2
    assert "mpiexec" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_failing_rank_is_reported_with_its_traceback():
    g = RankGroup("nosuchlib", 2, timeout=30)
    with pytest.raises(BenchError) as e:
        g.start()
    msg = str(e.value)
    assert "nosuchlib: rank" in msg and "library: expected mpi4py, torch, torch:ndist, torch:ndist-python, torch:ndist-op, deepspeed " in msg
    assert all(p.poll() is not None for p in g.procs)  # nothing left running


@pytest.mark.timeout(60)
def test_stranger_cannot_join(tmp_path):
    """A client without the run's key is refused; the real ranks still start."""
    if not HAVE_TORCH:
        pytest.skip("torch not installed")
    import threading
    from multiprocessing.connection import Client

    g = RankGroup("torch", 2, timeout=60)
    orig = g._commands
    refused = []

    def commands(address):
        host, port = address.rsplit(":", 1)

        def intrude():
            try:
                Client((host, int(port)), authkey=b"wrong key")
            except Exception as e:  # AuthenticationError or a closed connection
                refused.append(type(e).__name__)

        threading.Thread(target=intrude, daemon=True).start()
        return orig(address)

    g._commands = commands
    g.start()
    try:
        res = g.run({"op": "all_reduce", "nbytes": 64, "dtype": "float32", "redop": "sum", "root": 0,
                     "iters": 1, "warmup": 0, "check": 1})
        assert [r["wrong"] for r in res] == [0, 0]
    finally:
        g.stop()
    assert refused


@pytest.mark.timeout(60)
@pytest.mark.skipif(not HAVE_MPI, reason="mpi4py / mpiexec not installed")
def test_a_hung_collective_times_out_and_is_killed():
    """Only rank 0 is asked to all_reduce: it waits forever for rank 1; the launcher
    gives up at its deadline, names the library and what it waited for, and kills the job."""
    import time as _time

    hydra_before = hydra_files()
    g = RankGroup("mpi4py", 2, timeout=30).start()
    try:
        g.conns[0].send({"kind": "run", "op": "all_reduce", "nbytes": 64, "dtype": "float32", "redop": "sum",
                         "root": 0, "iters": 1, "warmup": 0, "check": 0})
        with pytest.raises(BenchError, match=r"mpi4py: no all_reduce 64 B from every rank within"):
            deadline = _time.monotonic() + 1.0
            while True:
                g._recv_any(deadline, "all_reduce 64 B", [0])
    finally:
        g.kill()
    assert all(p.poll() is not None for p in g.procs)
    _assert_gone([info["pid"] for info in g.ranks.values()])
    # MPICH's mpiexec (Hydra) writes a topology file in /tmp, which a SIGKILL leaves behind.
    left = hydra_files_left(hydra_before)
    assert not left, f"the killed job left MPICH's {left}"


def _assert_gone(pids, wait=10.0):
    """The rank processes themselves (children of mpiexec's proxy) are gone too."""
    import time as _time

    deadline = _time.monotonic() + wait
    alive = list(pids)
    while alive and _time.monotonic() < deadline:
        alive = [p for p in alive if os.path.exists(f"/proc/{p}") and "Z" not in _proc_state(p)]
        _time.sleep(0.05)
    assert not alive, f"rank processes still running: {alive}"


def _proc_state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


@pytest.mark.timeout(120)
@pytest.mark.skipif(not HAVE_MPI, reason="mpi4py / mpiexec not installed")
@pytest.mark.parametrize("stat", ["median", "min"])
def test_rounds_combine_by_stat(stat):
    import statistics

    cfg = parse_args(f"all_reduce -b 1K -e 2K -n 2 -w 0 -c 0 --nproc 2 --rounds 3 --stat {stat} "
                     "--backend none --compare mpi4py".split())
    for r in run_bench(cfg).rows:
        assert len(r.samples_us) == 3
        want = min(r.samples_us) if stat == "min" else statistics.median(r.samples_us)
        assert r.time_us == pytest.approx(want)


@pytest.mark.timeout(60)
def test_ranks_placed_by_the_caller_reach_a_unix_socket(tmp_path):
    """``RankGroup(commands=..., listen=PATH)``: the caller's commands start the ranks,
    each learns its rank from ``RANK`` (``env``), and they connect back over the Unix
    socket (as ranks in other network namespaces do, benchmarks/multihost.py); the path
    is gone once they are up."""
    sock = tmp_path / "g.sock"
    seen = []

    def commands(address):
        seen.append(address)
        return [["env", f"RANK={r}", sys.executable, "-m", "ndist.bench._worker", "ndist[socket]", "env", "2", address]
                for r in (1, 0)]

    g = RankGroup("ndist[socket]", 2, timeout=60, commands=commands, listen=str(sock)).start()
    try:
        assert seen == [str(sock)] and not sock.exists()
        assert sorted(g.ranks) == [0, 1] and g.command[:2] == ["env", "RANK=1"]
        res = g.run({"op": "all_reduce", "nbytes": 64, "dtype": "float32", "redop": "sum", "root": 0,
                     "iters": 1, "warmup": 0, "check": 1})
        assert [r["wrong"] for r in res] == [0, 0]
    finally:
        g.stop()
    assert all(p.poll() == 0 for p in g.procs)


@pytest.mark.timeout(30)
def test_worker_rank_env_needs_a_launcher_variable():
    env = {k: v for k, v in os.environ.items() if k not in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "RANK")}
    env["NDIST_BENCH_AUTHKEY"] = "00" * 32
    r = subprocess.run([sys.executable, "-m", "ndist.bench._worker", "ndist[socket]", "env", "2", "/nonexistent/s"],
                       env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "none of PMI_RANK" in r.stderr
