"""Reading ndist-bench's printed output in the bench tests."""

from __future__ import annotations


def table(out: str, lib: str, op: str) -> list[list[str]]:
    """Data rows (split into fields) of the table titled ``op -- lib`` in ``out``."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"# {op} -- {lib} --"))
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("# Avg bus bandwidth"):
            return rows
        if not line.startswith("#"):
            rows.append(line.split())
    raise AssertionError(f"no footer after the {lib} table:\n{out}")
