"""A fresh interpreter, for a test about what a process imports or loads on its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def prints(code: str, timeout: float | None = None) -> str:
    """What ``python -c code`` prints (stripped); fails the test, with its stderr, when it
    exits non-zero."""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def without(*modules: str) -> str:
    """Source to run first in a fresh interpreter (``-c``, or a ``sitecustomize.py``): a
    meta-path finder under which importing any of ``modules`` (dotted names; a submodule too)
    raises ``ModuleNotFoundError``, as on a machine without them; nothing of ndist is patched."""
    return textwrap.dedent(f"""
        import sys

        class _Without:
            def find_spec(self, name, path=None, target=None):
                if any(name == m or name.startswith(m + ".") for m in {modules!r}):
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        sys.meta_path.insert(0, _Without())
    """)
