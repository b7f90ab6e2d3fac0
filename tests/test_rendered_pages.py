"""A docs page's section between two markers is what a script renders from committed data,
so the page cannot drift from the data: docs/performance.md's results (``docs/perf/render.py``
from ``docs/perf/results/*.json``; more in test_perf_results.py) and docs/reliability.md's heal
figures (``docs/trials/render.py`` from ``docs/trials/results/*.json``, the trial harnesses'
output, gathered by ``render.py collect``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.docs_scripts import load_script


def _edit_a_cell(page: str) -> str:
    row = next(line for line in page.splitlines() if line.startswith("| 1 host x 2 | all_reduce |"))
    cells = row.split("|")
    cells[3] = " 9.99 (9.99) "                      # the 4 KiB cell
    return page.replace(row, "|".join(cells), 1)


def _edit_a_figure(page: str) -> str:
    row = next(line for line in page.splitlines() if line.startswith("| all |  |"))
    return page.replace(row, row.replace("**", "", 2), 1)


#: page: (its render script, what to run when it differs, a hand edit of one rendered figure)
PAGES = {
    "performance": (load_script(os.path.join("docs", "perf"), "render"),
                    "docs/performance.md differs from docs/perf/results: run python docs/perf/render.py",
                    _edit_a_cell),
    "reliability": (load_script(os.path.join("docs", "trials"), "render"),
                    "docs/reliability.md differs from docs/trials/results: run python docs/trials/render.py",
                    _edit_a_figure),
}


def _page(render) -> str:
    with open(render.PAGE, encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("page", PAGES)
def test_the_section_is_what_the_data_renders(page):
    render, hint, _ = PAGES[page]
    text = _page(render)
    assert render.BEGIN in text and render.END in text
    assert render.splice(text, render.render()) == text, hint


@pytest.mark.parametrize("page", PAGES)
def test_the_check_notices_an_edited_figure(page):
    render, _, edit = PAGES[page]
    text = _page(render)
    edited = edit(text)
    assert edited != text
    assert render.splice(edited, render.render()) != edited


@pytest.mark.parametrize("page", PAGES)
def test_render_check_exits_0_on_the_committed_page(page):
    render = PAGES[page][0]
    proc = subprocess.run([sys.executable, render.__file__, "--check"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
