"""What a user sees when a collective fails under ndistrun: the public error name, the
message and their own frames, a few lines per rank; the frames inside ndist only with
NDIST_DEBUG=INFO (and always in the rank's error file)."""

import json
import os

import pytest

import ndist

pytestmark = pytest.mark.timeout(180)

NDIST_DIR = os.path.dirname(os.path.abspath(ndist.__file__))

# Line numbers matter: the test looks for the user's frames by line.
MISMATCH = """\
import ndist
import ndist.distributed as dist

def train_step(rank):
    dist.all_reduce(ndist.ones(4 if rank == 0 else 8))

dist.init_process_group("socket")
train_step(dist.get_rank())
dist.destroy_process_group()
"""


def _run(launcher, *args, debug=None):
    env = dict(os.environ)
    env.pop("NDIST_DEBUG", None)
    if debug:
        env["NDIST_DEBUG"] = debug
    launcher.script(MISMATCH)
    return launcher.run(*args, "--nproc-per-node", 2, "job.py", env=env, timeout=150)


def _summary(err: str) -> str:
    return err[err.index("ndistrun: job.py FAILED"):]


def test_mismatch_prints_a_few_lines_with_the_public_name_and_the_users_frames(launcher):
    r = _run(launcher)
    assert r.returncode == 1, r.stderr
    out = r.stdout + r.stderr
    lines = out.splitlines()
    # Was 117 lines: 15 frames inside ndist per rank, twice for the root cause.
    assert len(lines) <= 40, f"{len(lines)} lines:\n{out}"
    assert "ndist.runtime._errors" not in out and "_errors.DistMismatchError" not in out
    assert NDIST_DIR not in out, out  # no frame inside ndist, on the ranks' lines or in the summary
    summary = _summary(r.stderr)
    assert "ndist.distributed.DistMismatchError: collective mismatch in group '0'" in summary
    assert 'job.py", line 5, in train_step' in summary and 'job.py", line 8, in <module>' in summary
    assert "frames inside ndist" in summary and "NDIST_DEBUG=INFO" in summary
    # Each rank's own lines are short too, and name the public error.
    for rank in (0, 1):
        mine = [ln for ln in lines if ln.startswith(f"[rank{rank}]:")]
        if mine:  # the second rank may be stopped by the launcher before it prints
            assert len(mine) <= 10, "\n".join(mine)
            assert any(ln.startswith(f"[rank{rank}]:ndist.distributed.DistMismatchError: ") for ln in mine)


def test_ndist_debug_info_shows_every_frame(launcher):
    r = _run(launcher, debug="INFO")
    assert r.returncode == 1, r.stderr
    summary = _summary(r.stderr)
    internal = os.path.join(NDIST_DIR, "collectives")
    assert internal in summary, summary
    assert any(ln.startswith("[rank") and internal in ln for ln in r.stderr.splitlines())
    assert "ndist.distributed.DistMismatchError: collective mismatch" in summary
    assert "frames inside ndist" not in r.stderr


def test_error_file_keeps_the_full_traceback(launcher):
    r = _run(launcher, "--log-dir", "logs")
    assert r.returncode == 1, r.stderr
    files = []
    for root, _dirs, names in os.walk(os.path.join(launcher.cwd, "logs")):
        files += [os.path.join(root, n) for n in names if n == "error.json"]
    assert files, r.stderr
    for path in files:
        with open(path) as f:
            rec = json.load(f)
        assert os.path.join(NDIST_DIR, "collectives") in rec["traceback"]
        assert "ndist.distributed.DistMismatchError" in rec["traceback"]
        assert rec["exc_type"] == "DistMismatchError"
    summary = _summary(r.stderr)
    assert "error file : " in summary and NDIST_DIR not in summary


def test_short_form_folds_ndist_frames_and_leaves_out_chains_raised_inside_ndist():
    import socket

    from ndist.launch import _bootstrap
    from ndist.runtime import _net

    a, b = socket.socketpair()
    b.close()

    def users_handshake():
        _net.client_handshake(a, b"secret", timeout=5)  # the peer is gone: OSError -> DistNetworkError

    try:
        users_handshake()
    except Exception as e:  # noqa: BLE001
        exc = e
    finally:
        a.close()
    full = _bootstrap.format_exception(exc, full=True)
    assert NDIST_DIR in full and "direct cause" in full  # what plain Python prints
    short = _bootstrap.format_exception(exc)
    assert "in users_handshake" in short and "in test_short_form_folds" in short
    assert NDIST_DIR not in short and "direct cause" not in short, short
    assert "[... 1 frame inside ndist (NDIST_DEBUG=INFO shows them) ...]" in short
    assert "DistNetworkError: handshake with server failed" in short.rstrip().splitlines()[-1]
    # Nothing to fold: "" (the hook then prints what plain Python prints).
    try:
        raise ValueError("user's own")
    except ValueError as e:
        assert _bootstrap.format_exception(e) == ""
