"""The seam between the public collectives and the backends: one declared
interface (``CollectiveBackend``), one call record (``Call``), no probing."""

from __future__ import annotations

import ast
import pathlib
import re

import numpy as np
import pytest

from ndist.collectives import Call, CollectiveBackend, Op, ReduceOp

from tests.collectives.backends._socket_threads import run_group

ROOT = pathlib.Path(__file__).resolve().parents[3] / "ndist"
pytestmark = pytest.mark.timeout(120)


def _minimal(**extra):
    """A concrete backend class with the abstract methods and ``extra`` overrides."""
    def op(self, call, *, blocking=False):
        raise NotImplementedError

    body = {m: op for m in ("all_reduce", "reduce", "broadcast", "gather", "scatter", "barrier", "send", "recv")}
    body["close"] = lambda self: None
    body.update(extra)
    return type("Minimal", (CollectiveBackend,), body)


def test_a_backend_must_implement_one_form_of_each_pair():
    with pytest.raises(TypeError, match="implement all_to_all or all_to_all_single"):
        _minimal(all_gather=lambda s, c, blocking=False: None, reduce_scatter=lambda s, c, blocking=False: None)
    with pytest.raises(TypeError, match="implement all_gather or all_gather_into"):
        _minimal(all_to_all=lambda s, c, blocking=False: None, reduce_scatter=lambda s, c, blocking=False: None)
    # either form of each pair is enough
    _minimal(all_to_all_single=lambda s, c, blocking=False: None, all_gather=lambda s, c, blocking=False: None,
             reduce_scatter_from=lambda s, c, blocking=False: None)


def test_every_op_has_a_method_of_its_name():
    for op in Op:
        assert callable(getattr(CollectiveBackend, op.value)), op


def test_the_record_is_immutable():
    call = Call(Op.ALL_REDUCE, "cpu", np.dtype("f4"), out=np.zeros(2, "f4"), redop=ReduceOp.SUM)
    with pytest.raises(AttributeError):
        call.root = 1


def _source(rel: str) -> str:
    return (ROOT / rel).read_text()


def test_the_public_layer_does_not_probe_backend_methods():
    # the criterion: no backend-method probing by name in the public layer
    names = {op.value for op in Op} | {"blocking_calls", "coalescing", "coalesces"}
    names |= {n + "_even" for n in ("all_to_all", "all_gather", "reduce_scatter")}
    for rel in ("collectives/_api.py", "collectives/_common.py", "collectives/_p2p.py"):
        for m in re.finditer(r"\b(hasattr|getattr)\(([^,]+),\s*([^,)]+)", _source(rel)):
            obj, attr = m.group(2), m.group(3).strip("'\" ")
            assert "backend" not in obj and attr not in names and "method" not in attr, f"{rel}: {m.group(0)}"


def test_runtime_never_imports_collectives_statically_or_by_string():
    for path in (ROOT / "runtime").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith(("collectives", "ndist.collectives")), path
                assert not (node.level >= 2 and (node.module or "").startswith("collectives")), path
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("ndist.collectives") for a in node.names), path
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert not re.match(r"ndist\.collectives", node.value), f"{path}: {node.value!r}"


def _single_forms(b):
    """The socket backend implements the list forms; the single-buffer forms are the
    interface's defaults (views of the buffers), uneven and even."""
    r, n = b.rank, b.size
    # all_to_all_single, uneven: rank r sends j + 1 elements to rank j
    inp = np.concatenate([np.full(j + 1, 10 * r + j, np.int64) for j in range(n)])
    out = np.empty(n * (r + 1), np.int64)
    b.all_to_all_single(out, inp, [r + 1] * n, [j + 1 for j in range(n)], blocking=True).wait()
    np.testing.assert_array_equal(out, np.concatenate([np.full(r + 1, 10 * s + r) for s in range(n)]))
    # even: no splits
    out = np.empty(2 * n)
    b.all_to_all_single(out, np.arange(2.0 * n) + 100 * r).wait()
    np.testing.assert_array_equal(out, np.concatenate([np.arange(2 * r, 2 * r + 2) + 100 * s for s in range(n)]))
    # all_gather_into, uneven and even
    out = np.empty(n * (n + 1) // 2, np.float32)
    b.all_gather_into(out, np.full(r + 1, r, np.float32), [s + 1 for s in range(n)]).wait()
    np.testing.assert_array_equal(out, np.concatenate([np.full(s + 1, s) for s in range(n)]))
    out = np.empty(3 * n, np.int32)
    b.all_gather_into(out, np.full(3, r, np.int32), blocking=True).wait()
    np.testing.assert_array_equal(out, np.repeat(np.arange(n), 3))
    # reduce_scatter_from, even and uneven (chunk j has j + 1 elements)
    mine = np.empty(2)
    b.reduce_scatter_from(mine, np.arange(2.0 * n) * (r + 1), ReduceOp.SUM).wait()
    np.testing.assert_array_equal(mine, np.arange(2 * r, 2 * r + 2) * n * (n + 1) / 2)
    mine = np.empty(r + 1)
    b.reduce_scatter_from(mine, np.ones(n * (n + 1) // 2), ReduceOp.MAX, in_splits=[j + 1 for j in range(n)],
                          blocking=True).wait()
    np.testing.assert_array_equal(mine, np.ones(r + 1))
    return True


@pytest.mark.parametrize("n", [1, 2, 3])
def test_single_buffer_defaults_on_a_list_form_backend(n):
    assert run_group(n, _single_forms) == [True] * n
