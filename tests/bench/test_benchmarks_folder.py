"""benchmarks/ by purpose (issue 45): every script is listed in benchmarks/README.md, uses
ndist.bench's public names only and edits no sys.path."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import ndist.bench

FOLDER = Path(__file__).resolve().parents[2] / "benchmarks"


def _scripts() -> list[Path]:
    return sorted(p for p in FOLDER.iterdir() if p.is_file() and p.name != "README.md")


def test_every_script_is_listed_by_purpose():
    listed = set(re.findall(r"`([\w.]+\.(?:py|c))`", (FOLDER / "README.md").read_text()))
    assert {p.name for p in _scripts()} == listed


def test_scripts_use_public_bench_names_and_leave_sys_path_alone():
    for path in _scripts():
        if path.suffix != ".py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ndist.bench"):
                assert node.module == "ndist.bench", f"{path.name} imports {node.module}"
                private = [a.name for a in node.names if a.name not in ndist.bench.__all__]
                assert not private, f"{path.name} imports {private} from ndist.bench, outside its __all__"
            if isinstance(node, ast.Import):
                assert not [a.name for a in node.names if a.name.startswith("ndist.bench._")], path.name
            if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", "") == "sys":
                raise AssertionError(f"{path.name}: line {node.lineno} uses sys.path")
