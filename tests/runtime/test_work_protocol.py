"""Work's protocol for subclasses and backends (issue #13).

Backends subclass ``ndist.runtime.Work`` (``MPIWork``, ``CudaWork``) and
drive it through ``complete()``/``fail()``, the read-only ``finished`` /
``succeeded`` / ``error`` and the ``progress(timeout)`` hook. Its state, its
Future and the state constants stay private to ``ndist/runtime/``: these
tests read the package's source to keep it so, and check the protocol on
real Works.
"""

from __future__ import annotations

import ast
import os
import threading

import pytest

from ndist.runtime import DistNetworkError, DistTimeoutError, Work

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = os.path.join(ROOT, "ndist")
RUNTIME = os.path.join(PKG, "runtime")

# Work's private members: its slots and methods/properties that start with one underscore.
PRIVATE = {n for n in vars(Work) if n.startswith("_") and not n.startswith("__")}
# The ones that hold its state. Any receiver counts (``w._state``, ``e.work._state``), except
# where another class has a member of that name of its own (listed with the class).
STATE = {"_state", "_exc", "_fut", "_future", "_future_done"}
OTHER_OWNERS = {
    ("ndist/tensor/_shm.py", "_state"),  # a shared-memory segment's dict
    ("ndist/torch/_work.py", "_fut"),  # NdistWork (torch's c10d Work), not ndist's
}
CONSTANTS = {"PENDING", "OK", "FAILED"}


def _modules():
    for dirpath, _dirs, files in os.walk(PKG):
        if os.path.commonpath([dirpath, RUNTIME]) == RUNTIME:
            continue
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    yield os.path.relpath(path, ROOT).replace(os.sep, "/"), ast.parse(f.read(), path)


def _work_subclasses(trees) -> set[str]:
    """Names of the classes outside runtime/ that derive from Work, directly or not.

    ndist's Work is imported by name (``from ....runtime import Work``); a base
    spelled ``module.Work`` is someone else's (``torch.distributed.Work``).
    """
    bases = {}
    for _path, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = {b.id for b in node.bases if isinstance(b, ast.Name)}
    found, grew = {"Work"}, True
    while grew:
        new = {name for name, b in bases.items() if b & found} - found
        found |= new
        grew = bool(new)
    return found - {"Work"}


def _violations() -> list[str]:
    trees = list(_modules())
    subclasses = _work_subclasses(trees)
    assert {"CudaWork", "MPIWork"} <= subclasses  # the scan sees the backends' Works
    out = []
    for path, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if module.endswith("runtime._work") or module.endswith("runtime") and "_work" in {
                        a.name for a in node.names}:
                    out.append(f"{path}:{node.lineno}: imports runtime._work (import Work from ndist.runtime)")
                if "runtime" in module and CONSTANTS & {a.name for a in node.names}:
                    out.append(f"{path}:{node.lineno}: imports Work's state constants")
            elif isinstance(node, ast.Attribute) and node.attr in STATE and (path, node.attr) not in OTHER_OWNERS:
                out.append(f"{path}:{node.lineno}: .{node.attr}")
            elif isinstance(node, ast.ClassDef) and node.name in subclasses:
                for sub in ast.walk(node):
                    if isinstance(sub, ast.FunctionDef) and sub.name in PRIVATE:
                        out.append(f"{path}:{sub.lineno}: {node.name} overrides Work.{sub.name}")
                    elif (isinstance(sub, ast.Attribute) and sub.attr in PRIVATE
                          and isinstance(sub.value, ast.Name) and sub.value.id == "self"):
                        out.append(f"{path}:{sub.lineno}: {node.name} uses self.{sub.attr}")
    return sorted(set(out))


def test_no_module_outside_runtime_touches_work_internals():
    assert _violations() == []


# ------------------------------------------------------------------ behaviour
def test_state_properties_follow_completion():
    w = Work("all_reduce", 1, outputs=["t"])
    assert (w.finished, w.succeeded, w.error) == (False, False, None)
    w.complete()
    assert (w.finished, w.succeeded, w.error) == (True, True, None)
    w.fail(RuntimeError("late"))  # ignored: a Work ends once
    assert (w.finished, w.succeeded, w.error) == (True, True, None)

    err = DistNetworkError("peer 2 lost", rank=2, host="h")
    f = Work.failed("all_to_all", err, seq=7)
    assert (f.finished, f.succeeded, f.error) == (True, False, err)
    assert f.exception() is err and not f.is_success() and f.is_completed()


def test_state_properties_are_read_only():
    w = Work.completed("x")
    for name in ("finished", "succeeded", "error"):
        with pytest.raises(AttributeError):
            setattr(w, name, None)


def test_progress_waits_for_the_backend_and_wait_uses_it():
    w = Work("barrier", 0)
    assert w.progress(0.01) is False and not w.finished
    threading.Timer(0.05, w.complete).start()
    assert w.progress(5) is True and w.succeeded


class _Driven(Work):
    """A Work that completes only when driven, like MPIWork: the protocol's own use case."""

    __slots__ = ("calls", "ready", "outcome")

    def __init__(self, ready_after: int, outcome: BaseException | None = None) -> None:
        super().__init__("recv", 3)
        self.calls, self.ready, self.outcome = [], ready_after, outcome

    def progress(self, timeout):
        self.calls.append(timeout)
        if not self.finished and len(self.calls) >= self.ready:
            self.fail(self.outcome) if self.outcome is not None else self.complete()
        return self.finished


def test_wait_drives_a_subclass_through_progress():
    w = _Driven(ready_after=1)
    assert w.wait(2.5) is True and w.calls == [2.5] and w.succeeded
    assert w.wait() is True and w.calls == [2.5]  # finished: progress is not asked again

    lazy = _Driven(ready_after=2)
    with pytest.raises(DistTimeoutError, match=r"recv \(#3\) did not complete within 0.1 s"):
        lazy.wait(0.1)
    assert lazy.wait() is True and lazy.calls == [0.1, None]

    err = ValueError("bad")
    failing = _Driven(ready_after=1, outcome=err)
    with pytest.raises(ValueError) as info:
        failing.wait()
    assert info.value is err and failing.error is err and not failing.succeeded


def test_repr_names_state():
    assert repr(Work("a", 1)) == "<Work a #1 pending>"
    assert repr(Work.completed("a", 2)) == "<Work a #2 ok>"
    assert repr(Work.failed("a", RuntimeError(), 3)) == "<Work a #3 failed>"
