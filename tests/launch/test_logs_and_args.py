"""--log-dir / --redirects / --tee files, and bad command lines refused before anything starts."""

import glob
import os

import pytest

from ndist.launch._config import parse_std_spec
from ndist.launch._output import StreamPump

pytestmark = pytest.mark.timeout(60)

TALK = 'import os, sys\nprint("out", os.environ["RANK"])\nprint("err", os.environ["RANK"], file=sys.stderr)\n'


def _rank_dir(base, lr, attempt=0):
    (job,) = glob.glob(os.path.join(base, "myrun_*"))
    return os.path.join(job, f"attempt_{attempt}", str(lr))


def _read(path):
    with open(path) as f:
        return f.read()


def test_redirects_send_streams_to_files_only(launcher):
    launcher.script(TALK)
    r = launcher.run("--nproc-per-node", 2, "--rdzv-id", "myrun", "--log-dir", "logs", "--redirects", 3, "job.py")
    assert r.returncode == 0, r.stderr
    assert "[rank" not in r.stdout and "[rank" not in r.stderr
    for lr in (0, 1):
        d = _rank_dir(os.path.join(launcher.cwd, "logs"), lr)
        assert _read(os.path.join(d, "stdout.log")) == f"out {lr}\n"  # raw, no prefix
        assert _read(os.path.join(d, "stderr.log")) == f"err {lr}\n"
    assert "logs" in r.stderr  # the launcher says where the files are


def test_tee_and_per_rank_redirects(launcher):
    launcher.script(TALK)
    r = launcher.run("--nproc-per-node", 2, "--rdzv-id", "myrun", "--log-dir", "logs",
                     "--tee", 2, "--redirects", "1:1", "job.py")
    assert r.returncode == 0, r.stderr
    # rank 0: stdout on the console only, stderr teed; rank 1: stdout to the file only, stderr teed.
    assert r.stdout.splitlines() == ["[rank0]:out 0"]
    assert sorted(l for l in r.stderr.splitlines() if l.startswith("[rank")) == ["[rank0]:err 0", "[rank1]:err 1"]
    base = os.path.join(launcher.cwd, "logs")
    assert not os.path.exists(os.path.join(_rank_dir(base, 0), "stdout.log"))
    assert _read(os.path.join(_rank_dir(base, 0), "stderr.log")) == "err 0\n"
    assert _read(os.path.join(_rank_dir(base, 1), "stdout.log")) == "out 1\n"
    assert _read(os.path.join(_rank_dir(base, 1), "stderr.log")) == "err 1\n"


def test_log_dir_keeps_error_files_per_attempt(launcher):
    launcher.script('import os\nif os.environ["NDIST_RESTART_COUNT"] == "0": raise KeyError("first try")\n')
    r = launcher.run("--nproc-per-node", 1, "--rdzv-id", "myrun", "--log-dir", "logs", "--max-restarts", 1, "job.py")
    assert r.returncode == 0, r.stderr
    import json

    rec = json.loads(_read(os.path.join(_rank_dir(os.path.join(launcher.cwd, "logs"), 0, 0), "error.json")))
    assert rec["exc_type"] == "KeyError" and rec["rank"] == 0 and "first try" in rec["traceback"]
    assert not os.path.exists(os.path.join(_rank_dir(os.path.join(launcher.cwd, "logs"), 0, 1), "error.json"))


def test_failure_summary_points_at_log_dir(launcher):
    launcher.script('raise RuntimeError("bad")\n')
    r = launcher.run("--nproc-per-node", 1, "--rdzv-id", "myrun", "--log-dir", "logs", "job.py")
    assert r.returncode == 1
    assert "error file : " in r.stderr and "error.json" in r.stderr
    assert "logs: " + os.path.join("logs", "myrun_") in r.stderr


def test_no_log_dir_leaves_no_files_behind(launcher, tmp_path, monkeypatch):
    launcher.script('raise RuntimeError("bad")\n')
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    r = launcher.run("--nproc-per-node", 2, "job.py", env={**os.environ, "TMPDIR": str(tmp)})
    assert r.returncode == 1 and "RuntimeError: bad" in r.stderr
    assert os.listdir(tmp) == []


@pytest.mark.parametrize(
    "args, message",
    [
        (["--nproc-per-node", "0", "job.py"], "--nproc-per-node: expected a positive integer, 'auto' or 'cpu', got 0"),
        (["--nproc-per-node", "two", "job.py"], "--nproc-per-node: expected a positive integer, 'auto' or 'cpu', got 'two'"),
        (["--nnodes", "1:4", "job.py"], "--nnodes: elastic ranges (MIN:MAX) are not supported"),
        (["--nnodes", "2", "--node-rank", "2", "job.py"], "--node-rank: expected an integer in 0..1, got 2"),
        (["--nnodes", "2", "--node-rank", "1", "job.py"], "--master-addr: required on node 1"),
        (["--master-port", "70000", "job.py"], "--master-port: expected an integer in 0..65535, got 70000"),
        (["--redirects", "4", "job.py"], "--redirects: expected 0-3"),
        (["--nproc-per-node", "2", "--tee", "5:1", "job.py"], "--tee: local rank 5 in '5:1' is not in 0..1"),
        (["--nproc-per-node", "2", "--local-ranks-filter", "0,7", "job.py"], "--local-ranks-filter: local ranks [7] are not in 0..1"),
        (["--max-restarts", "-1", "job.py"], "--max-restarts: expected an integer >= 0, got -1"),
        (["--rdzv-timeout", "soon", "job.py"], "--rdzv-timeout: expected a number of seconds, got 'soon'"),
        (["missing.py"], "script: no such file: 'missing.py'"),
        ([".."], "script: expected a Python file, got the directory '..'"),
        (["-m", "--no-python", "job.py"], "not allowed with argument"),
        (["--standalone", "--nnodes", "2", "job.py"], "--standalone: runs a single-node job, but --nnodes is 2"),
        ([], "the following arguments are required: script"),
        (["--run-path", "job.py"], "--run-path is not supported"),
        (["--rdzv-id", "a/b", "job.py"], "--rdzv-id: expected a non-empty id without '/', got 'a/b'"),
        (["--master-addr", "h", "--rdzv-endpoint", "h:1", "job.py"], "--rdzv-endpoint: give either it or --master-addr"),
        (["--nnodes", "2", "--master-port", "0", "job.py"], "--master-port: a multi-node job needs a fixed port"),
    ],
)
def test_bad_arguments(launcher, args, message):
    launcher.script("open('ran', 'w').close()\n")
    r = launcher.run(*args, timeout=30)
    assert r.returncode == 2
    assert message in r.stderr, r.stderr
    assert not os.path.exists(os.path.join(launcher.cwd, "ran"))


def test_multinode_needs_a_shared_secret(launcher):
    launcher.script("open('ran', 'w').close()\n")
    env = {k: v for k, v in os.environ.items() if k != "NDIST_SECRET"}
    r = launcher.run("--nnodes", 2, "--master-port", 1, "job.py", env=env, timeout=30)
    assert r.returncode == 2
    assert "needs a job secret shared by every node: set NDIST_SECRET" in r.stderr
    assert not os.path.exists(os.path.join(launcher.cwd, "ran"))


def test_parse_std_spec():
    assert parse_std_spec("3", 2) == (3, 3)
    assert parse_std_spec("0:1,2:2", 3) == (1, 0, 2)
    for bad in ("", "x", "1:", "1:4", "a:1", "0:1;1:2"):
        with pytest.raises(ValueError, match="--redirects: expected"):
            parse_std_spec(bad, 3)


def _pump_through(chunks, prefix=b"[r]:"):
    import tempfile

    r_in, w_in = os.pipe()
    with tempfile.TemporaryFile() as out:
        pump = StreamPump(r_in, out.fileno(), prefix)
        for c in chunks:
            os.write(w_in, c)
            assert pump.read_available()
        os.close(w_in)
        assert pump.read_available() is False
        pump.close()
        out.seek(0)
        return out.read()


def test_pump_holds_partial_lines_until_newline_or_close():
    assert _pump_through([b"ab", b"c\nde", b"f\n\ng"]) == b"[r]:abc\n[r]:def\n[r]:\n[r]:g\n"
    assert _pump_through([b"x" * 40000, b"x" * 30000]) == b"[r]:" + b"x" * 70000 + b"\n"  # long line: forwarded in pieces
    assert _pump_through([b"a\r\nb\n"], prefix=b"") == b"a\r\nb\n"


def test_run_in_process_returns_the_status_and_restores_signals(tmp_path):
    import signal

    from ndist.launch import run

    ok, bad = tmp_path / "ok.py", tmp_path / "bad.py"
    ok.write_text("pass\n")
    bad.write_text("import sys; sys.exit(4)\n")
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    assert run(["--nproc-per-node", "2", str(ok)]) == 0
    assert run(["--nproc-per-node", "2", str(bad)]) == 4
    assert run(["--nproc-per-node", "x", str(ok)]) == 2
    assert {s: signal.getsignal(s) for s in before} == before
    assert signal.set_wakeup_fd(-1) == -1


@pytest.mark.parametrize("endpoint, addr, port", [
    ("node0:1234", "node0", 1234), ("node0", "node0", None), ("[::1]:29501", "::1", 29501), ("::1", "::1", None),
])
def test_rdzv_endpoint_parsing(tmp_path, endpoint, addr, port):
    from ndist.launch._config import parse_args

    script = tmp_path / "s.py"
    script.write_text("")
    c = parse_args(["--rdzv-endpoint", endpoint, str(script)])
    assert (c.master_addr, c.master_port) == (addr, port)


def test_ipv6_loopback_store(launcher):
    import socket

    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    launcher.script("""
import os
from ndist.runtime.store import TCPStore
host, _, port = os.environ["NDIST_STORE"].rpartition(":")
TCPStore(host, int(port), is_master=False, timeout=30).set("k", "v")
print(host)
""")
    r = launcher.run("--nproc-per-node", 1, "--master-addr", "::1", "job.py")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "[rank0]:::1\n"
