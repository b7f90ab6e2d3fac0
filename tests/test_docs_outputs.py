"""The outputs pasted into docs/troubleshooting.md are what the code prints.

The example programs are taken from the page itself (```python blocks whose
first line is ``# name.py``), run under ``ndistrun`` with 2 ranks, and the
pasted lines are compared with the real output (pids and host names aside).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "troubleshooting.md")


def _page() -> str:
    with open(PAGE, encoding="utf-8") as f:
        return f.read()


def _blocks(lang: str) -> list[str]:
    """The fenced code blocks of the page whose info string is ``lang`` ("" for plain ones)."""
    blocks, current, info = [], None, ""
    for line in _page().splitlines():
        fence = line.strip()
        if fence.startswith("```"):
            if current is None:
                current, info = [], fence[3:].strip()
            else:
                if info == lang:
                    blocks.append("\n".join(current) + "\n")
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def _script(name: str) -> str:
    for block in _blocks("python"):
        if block.startswith(f"# {name}\n"):
            return block
    raise AssertionError(f"docs/troubleshooting.md has no ```python block starting with '# {name}'")


def _run(tmp_path, name: str) -> str:
    path = tmp_path / name
    path.write_text(_script(name))
    env = dict(os.environ)
    env.pop("NDIST_DEBUG", None)
    proc = subprocess.run([sys.executable, "-m", "ndist.launch", "--nproc-per-node", "2", f"./{name}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode != 0, "the example was meant to fail"
    # The page shortens paths: the script's directory to ".", the checkout to <checkout>.
    return (proc.stdout + proc.stderr).replace(str(tmp_path), ".").replace(ROOT, "<checkout>")


def _normalise(line: str) -> str:
    line = re.sub(r"(pid\s+:) \d+", r"\1 N", line)
    return re.sub(r"(host\s+:) \S+", r"\1 H", line)


def _pasted_summary(script: str) -> list[str]:
    """The failure summary pasted for ``script`` (between its ==== rules)."""
    for block in _blocks(""):
        if f"ndistrun: ./{script} FAILED" in block:
            lines = block.splitlines()
            start = next(i for i, ln in enumerate(lines) if ln.startswith("=" * 20))
            end = max(i for i, ln in enumerate(lines) if ln.startswith("=" * 20))
            return lines[start:end + 1]
    raise AssertionError(f"no pasted failure summary of {script}")


@pytest.mark.timeout(180)
def test_failure_summary_is_pasted_as_printed(tmp_path):
    out = _run(tmp_path, "fail.py")
    real = [_normalise(ln) for ln in out.splitlines()]
    if "other failures:" in real:
        # Whether rank 0 raised before it was stopped depends on timing; the page shows
        # that section on its own, so compare the summary without it.
        i = real.index("other failures:")
        j = next(k for k in range(i, len(real)) if real[k].startswith("=" * 20))
        assert all(ln.startswith("  rank 0 on ") for ln in real[i + 1:j]), real[i:j]
        real = real[:i] + real[j:]
    pasted = [_normalise(ln) for ln in _pasted_summary("fail.py")]
    start = real.index(pasted[0])
    assert real[start:start + len(pasted)] == pasted


@pytest.mark.timeout(180)
def test_mismatch_lines_are_pasted_as_printed(tmp_path):
    out = _run(tmp_path, "mismatch.py")

    def message(line: str) -> str:  # without the [rankN]: prefix and the summary's indent
        return re.sub(r"^\[rank\d+\]:", "", line).strip()

    pasted = {message(ln) for block in _blocks("") for ln in block.splitlines()
              if "DistMismatchError" in ln and "broadcast" in ln}
    assert len(pasted) == 2
    real = {message(ln) for ln in out.splitlines() if "DistMismatchError:" in ln}
    # Both ranks raise; the second may be stopped by the launcher before it prints, but the
    # root cause's message is always in the summary.
    assert real and real <= pasted, f"real: {real}\npasted: {pasted}\n--- output ---\n{out}"


@pytest.mark.timeout(180)
def test_collective_timeout_line_is_pasted_as_printed(tmp_path):
    out = _run(tmp_path, "hang2.py")
    pasted = [ln.strip() for block in _blocks("") for ln in block.splitlines()
              if "DistTimeoutError: group" in ln and "timed out" in ln]
    assert pasted, "the timeout error line is not on the page"
    assert pasted[0] in [ln.strip() for ln in out.splitlines()], out
