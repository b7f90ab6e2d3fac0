"""docs/reliability.md's heal figures cannot drift from their data.

The section between the markers is what ``docs/trials/render.py`` makes of the committed
``docs/trials/results/*.json`` (the trial harnesses' output, gathered by ``render.py collect``)."""

from __future__ import annotations

import os

from tests import rendered_page

render = rendered_page.load_script(os.path.join("docs", "trials"), "render")


def test_the_heal_figures_are_what_the_data_renders():
    rendered_page.check_the_section_is_what_the_data_renders(
        render, "docs/reliability.md differs from docs/trials/results: run python docs/trials/render.py")


def _edit_a_figure(page: str) -> str:
    row = next(line for line in page.splitlines() if line.startswith("| all |  |"))
    return page.replace(row, row.replace("**", "", 2), 1)


def test_the_check_notices_an_edited_figure():
    rendered_page.check_the_check_notices(render, _edit_a_figure)


def test_render_check_exits_0_on_the_committed_page():
    rendered_page.check_render_check_exits_0(render)
