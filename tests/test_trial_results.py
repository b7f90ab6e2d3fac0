"""docs/reliability.md's heal figures cannot drift from their data.

The section between the markers is what ``docs/trials/render.py`` makes of the committed
``docs/trials/results/*.json`` (the trial harnesses' output, gathered by ``render.py collect``)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRIALS = os.path.join(ROOT, "docs", "trials")

_spec = importlib.util.spec_from_file_location("trials_render", os.path.join(TRIALS, "render.py"))
render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render)


def _page() -> str:
    with open(render.PAGE, encoding="utf-8") as f:
        return f.read()


def test_the_heal_figures_are_what_the_data_renders():
    page = _page()
    assert render.BEGIN in page and render.END in page
    assert render.splice(page, render.render()) == page, \
        "docs/reliability.md differs from docs/trials/results: run python docs/trials/render.py"


def test_the_check_notices_an_edited_figure():
    page = _page()
    row = next(line for line in page.splitlines() if line.startswith("| all |  |"))
    edited = page.replace(row, row.replace("**", "", 2), 1)
    assert edited != page
    assert render.splice(edited, render.render()) != edited


def test_render_check_exits_0_on_the_committed_page():
    proc = subprocess.run([sys.executable, os.path.join(TRIALS, "render.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
