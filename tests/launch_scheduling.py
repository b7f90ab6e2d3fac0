"""pytest-xdist's scheduling for ``-n N``: as its default (``--dist load``), except that the
tests which share one cached launch of ranks run on one worker, which launches once.

The collectives' suites run one launch per backend entry (and world size) and report each
case of it as a test of its own (``collective_launch.one_launch`` marks those parameters with
``xdist_group``). Spread over the workers, each worker ran the same launch for its share of
the cases. xdist's own ``--dist loadgroup`` would keep them together, but under pytest 9 it
no longer does (the group suffix it writes to a test's node id does not reach the id).

The controller collects nothing, so it learns the groups from the test modules themselves: a
module whose source calls ``one_launch(`` is imported here, and a test whose node id starts
with such a parameter's id (the parameter nearest the function comes first in the id) is
scheduled with the other tests of its group. A module whose source holds the line
``XDIST_ONE_WORKER = True`` is one unit: its tests share an expensive module-scoped set-up
(test_native_kernels.py's compile of the kernels), which each worker would otherwise repeat.
Every other test is a unit of its own; the largest units go out first
(``LoadScopeScheduling``), then the rest in collection order.
"""

from __future__ import annotations

import importlib
import os

from xdist.scheduler import LoadScopeScheduling


#: the line that puts all of a module's tests on one worker
ONE_WORKER = "XDIST_ONE_WORKER = True"


def _groups_of(module) -> dict:
    """``{(test function name, parameter id): group}`` for ``module``'s ``xdist_group`` parameters."""
    found = {}
    for name, fn in vars(module).items():
        if not name.startswith("test") or not callable(fn):
            continue
        for mark in getattr(fn, "pytestmark", []):
            if mark.name != "parametrize" or len(mark.args) < 2:
                continue
            for value in mark.args[1]:
                for m in getattr(value, "marks", ()):
                    if m.name == "xdist_group" and getattr(value, "id", None):
                        found[(name, value.id)] = m.args[0] if m.args else m.kwargs.get("name", "default")
    return found


class LaunchScheduling(LoadScopeScheduling):
    """``LoadScopeScheduling`` whose scopes are the launch groups (one test each otherwise)."""

    def __init__(self, config, log=None) -> None:
        super().__init__(config, log)
        self._root = str(config.rootpath)
        self._modules: dict = {}  # node id path -> its {(function, parameter id): group}
        self._one_worker: dict = {}  # node id path -> whether its tests are one unit

    def _source(self, path: str) -> str:
        try:
            with open(os.path.join(self._root, path)) as f:
                return f.read()
        except OSError:
            return ""

    def _module_groups(self, path: str) -> dict:
        if path not in self._modules:
            self._modules[path] = {}
            uses = "one_launch(" in self._source(path)
            if uses and path.endswith(".py"):
                try:
                    module = importlib.import_module(path[:-3].replace("/", "."))
                except Exception:  # noqa: BLE001 - its tests run ungrouped (the workers report the error)
                    return self._modules[path]
                self._modules[path] = _groups_of(module)
        return self._modules[path]

    def _split_scope(self, nodeid: str) -> str:
        path, _, rest = nodeid.partition("::")
        if path not in self._one_worker:
            self._one_worker[path] = any(line.strip() == ONE_WORKER for line in self._source(path).splitlines())
        if self._one_worker[path]:
            return path
        name, bracket, params = rest.partition("[")
        if not bracket:
            return nodeid
        params = params[:-1] if params.endswith("]") else params
        best = None
        for (fn, pid), group in self._module_groups(path).items():
            if fn == name and (params == pid or params.startswith(pid + "-")) and (best is None or len(pid) > best[0]):
                best = (len(pid), group)
        return f"{path}::{best[1]}" if best else nodeid
