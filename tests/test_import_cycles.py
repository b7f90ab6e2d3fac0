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


# The socket backend's sub-packages, lowest first (docs/socket.md, "Layout: one sub-package per
# concern"): a module may import its own sub-package and those below it, never one
# above. The modules directly in socket/ (the backend's wiring: ``_backend``, ``_executor``,
# ``_pending``, ``_engines``) sit above them all.
SOCKET = "ndist.collectives.backends.socket"
SOCKET_LAYERS = ("wire", "schedules", "failure", "p2p", "engine", "native")


def _layer(module: str, package: str, layers: tuple[str, ...]) -> int:
    """The index of ``module``'s sub-package in ``layers``; ``len(layers)`` for the package
    itself and the modules directly in it."""
    sub = module[len(package) + 1:].split(".")[0] if module != package else ""
    return layers.index(sub) if sub in layers else len(layers)


def upward_imports(graph: dict[str, set[str]], package: str, layers: tuple[str, ...]) -> list[str]:
    """Every import from a sub-package of ``package`` into a sub-package above it in
    ``layers`` (or into the modules directly in ``package``), as ``"a -> b"``."""
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                  if _layer(a, package, layers) < len(layers)
                  and _layer(b, package, layers) > _layer(a, package, layers))


def test_socket_subpackages_import_only_downward():
    graph = import_graph(ROOT / "ndist/collectives/backends/socket")
    subs = {p.name for p in (ROOT / "ndist/collectives/backends/socket").iterdir()
            if p.is_dir() and (p / "__init__.py").exists()}
    assert subs == set(SOCKET_LAYERS), f"socket/ sub-packages {sorted(subs)}: give each its place in SOCKET_LAYERS"
    up = upward_imports(graph, SOCKET, SOCKET_LAYERS)
    assert not up, "imports pointing up between socket/'s sub-packages: " + "; ".join(up)


def test_the_layer_check_finds_an_upward_import(tmp_path):
    """An import from a lower sub-package into a higher one, and one into the package's own
    top modules, are found; downward ones and those within a sub-package are not."""
    pkg = tmp_path / "pkg"
    for sub in ("low", "high"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "_top.py").write_text("from .high import _h\n")
    (pkg / "high" / "_h.py").write_text("from ..low import _l\nfrom . import _h2\n")
    (pkg / "high" / "_h2.py").write_text("")
    (pkg / "low" / "_l.py").write_text("def f():\n    from ..high import _h2\n    from .. import _top\n")
    graph = import_graph(pkg, tmp_path)
    assert upward_imports(graph, "pkg", ("low", "high")) == [
        "pkg.low._l -> pkg._top", "pkg.low._l -> pkg.high", "pkg.low._l -> pkg.high._h2"]
