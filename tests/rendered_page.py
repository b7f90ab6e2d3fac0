"""A docs page whose section between two markers is rendered from committed data by a
script (``docs/perf/render.py``, ``docs/trials/render.py``): the checks that the page cannot
drift from its data, shared by the tests of each page."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(folder: str, name: str):
    """``<checkout>/<folder>/<name>.py`` as a module (the docs' scripts are not a package)."""
    path = os.path.join(ROOT, folder, f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"{os.path.basename(folder)}_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def page(render) -> str:
    with open(render.PAGE, encoding="utf-8") as f:
        return f.read()


def check_the_section_is_what_the_data_renders(render, hint: str) -> None:
    text = page(render)
    assert render.BEGIN in text and render.END in text
    assert render.splice(text, render.render()) == text, hint


def check_the_check_notices(render, edit) -> None:
    """``edit(page)``: the page with one rendered figure changed by hand."""
    text = page(render)
    edited = edit(text)
    assert edited != text
    assert render.splice(edited, render.render()) != edited


def check_render_check_exits_0(render) -> None:
    proc = subprocess.run([sys.executable, render.__file__, "--check"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
