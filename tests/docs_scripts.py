"""The docs' own scripts (``docs/perf/render.py``, ``docs/trials/render.py``, ...) as modules,
for their tests: the scripts are files of a folder, not a package."""

from __future__ import annotations

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(folder: str, name: str):
    """``<checkout>/<folder>/<name>.py`` as a module."""
    path = os.path.join(ROOT, folder, f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"{os.path.basename(folder)}_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
