"""docs/torch.md's script, run as the page shows (torchrun, 2 ranks), prints what the page says."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.torch_backend.torch_helpers import torchrun_tmp  # noqa: E402

pytestmark = pytest.mark.torch

PAGE = Path(__file__).resolve().parents[2] / "docs" / "torch.md"


def _blocks(text: str, lang: str) -> list[str]:
    """The bodies of the fenced blocks of language ``lang`` ("" for untyped ones)."""
    return [body for tag, body in re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M) if tag == lang]


def test_page_shows_the_three_line_change():
    (diff,) = _blocks(PAGE.read_text(), "diff")
    lines = diff.strip().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("+import ndist.torch")
    assert lines[1] == '-dist.init_process_group("gloo")' and lines[2] == '+dist.init_process_group("ndist")'


@pytest.mark.timeout(240)
def test_ddp_script_runs_under_torchrun_and_prints_what_the_page_shows(tmp_path):
    text = PAGE.read_text()
    script = next(b for b in _blocks(text, "python") if 'init_process_group("ndist")' in b)
    (tmp_path / "train.py").write_text(script)
    shown = next(b for b in _blocks(text, "") if b.startswith("$ torchrun"))
    command, *expected = shown.strip().splitlines()
    argv = command[2:].split()
    assert argv[:2] == ["torchrun", "--standalone"]  # --standalone: a free port, no fixed one
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["TMPDIR"] = torchrun_tmp(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *argv[1:]], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=200)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    # Each rank prints one line; two processes share the pipe, and with PYTHONUNBUFFERED a
    # print is two writes (text, newline), so lines may interleave: compare the lines found.
    import re

    found = re.findall(r"rank \d+ of \d+: [^\n]*?(?:True|False)", out)
    assert sorted(found) == sorted(expected), (out, err[-2000:])
