"""Imports point downward: no import cycle inside the packages that once had one
(``ndist/tensor``, the socket backend, ``ndist/torch``; issue 28).

Every import counts, at module level or inside a function or an ``if TYPE_CHECKING:``
block: a function-level import that closes a cycle hides it from Python at import
time, not from the design. A function-level import that exists for a lazy reason
(CuPy, torch, a module only the failure path needs) forms no cycle, so it passes.
The graph is read from the source (``ast``), nothing is imported."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("ndist/tensor", "ndist/collectives/backends/socket", "ndist/torch")


def _name(path: pathlib.Path, top: pathlib.Path) -> str:
    parts = path.relative_to(top).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _targets(node: ast.AST, package: str, known: set[str]) -> list[str]:
    """The modules of ``known`` that an import statement names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    subs = [f"{mod}.{a.name}" for a in node.names]
    found = [s for s in subs if s in known]
    # ``from pkg import name`` where ``name`` is no submodule reads pkg's namespace
    return found + ([mod] if len(found) < len(subs) else [])


def import_graph(root: pathlib.Path, top: pathlib.Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of the same package tree that importing it runs: what it
    imports anywhere in its file, and the packages Python initialises on the way to
    them (except the importer's own, which are already under way)."""
    paths = {_name(p, top): p for p in sorted(root.rglob("*.py"))}
    known = set(paths)
    graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, package, known):
                parts = target.split(".")
                for i in range(1, len(parts) + 1):
                    step = ".".join(parts[:i])
                    if step in known and (step == target or not _within(name, step)):
                        edges.add(step)
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as
    sorted module names."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package):
    graph = import_graph(ROOT / package)
    assert len(graph) > 3, f"{package}: found only {sorted(graph)}"
    found = cycles(graph)
    assert not found, f"{package}: import cycles " + "; ".join(
        " <-> ".join(c) + " (" + ", ".join(f"{a} -> {sorted(graph[a] & set(c))}" for a in c) + ")"
        for c in found)


def test_the_cycle_check_finds_a_cycle_closed_inside_a_function(tmp_path):
    """The check sees what the packages once had: two modules importing each other, one
    of them only inside a method, and a third reached through its package."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from ._a import A\n")
    (pkg / "_a.py").write_text("from .sub import B\n\nclass A:\n    pass\n")
    (pkg / "sub" / "__init__.py").write_text("from ._b import B\n")
    (pkg / "sub" / "_b.py").write_text("class B:\n    def f(self):\n        from .._a import A\n")
    (pkg / "_c.py").write_text("import os\n")
    graph = import_graph(pkg, tmp_path)
    assert graph["pkg._a"] == {"pkg.sub"} and graph["pkg.sub._b"] == {"pkg._a"}
    assert cycles(graph) == [["pkg._a", "pkg.sub", "pkg.sub._b"]]
