"""Bad calls around the lifetime of a job (not expressible in error_cases, which
runs inside an initialised job): a collective before init, a destroyed subgroup,
a collective after destroy; each is a ValueError naming the problem, and a valid
collective afterwards (on the world, or after a fresh init) works."""

import numpy as np
import pytest

from ndist.testing import run_ranks

_NOT_INIT = "Default process group has not been initialized, please make sure to call init_process_group"


def _lifecycle(rank, size):
    import ndist.distributed as d

    seen = {}

    def attempt(name, call):
        try:
            call()
            seen[name] = None
        except Exception as err:  # noqa: BLE001 - recorded for the assertions
            seen[name] = (type(err).__name__, str(err))

    attempt("before-init", lambda: d.all_reduce(np.zeros(1)))
    attempt("new_group-before-init", lambda: d.new_group([0]))
    attempt("destroy-before-init", lambda: d.destroy_process_group())
    d.init_process_group("socket")
    g = d.new_group([0, 1])
    d.all_reduce(np.zeros(1), group=g)
    d.destroy_process_group(g)
    attempt("destroyed-subgroup", lambda: d.all_reduce(np.zeros(1), group=g))
    attempt("destroyed-subgroup-async", lambda: d.broadcast(np.zeros(1), src=0, group=g, async_op=True))
    x = np.full(2, rank + 1.0)
    d.all_reduce(x)  # the world is untouched
    seen["world-after"] = x.tolist()
    d.destroy_process_group()
    attempt("after-destroy", lambda: d.all_reduce(np.zeros(1)))
    d.init_process_group("socket")  # a fresh init works
    y = np.full(2, rank + 1.0)
    d.all_reduce(y)
    seen["reinit"] = y.tolist()
    d.destroy_process_group()
    return seen


@pytest.mark.timeout(90)
def test_before_init_after_destroy_and_destroyed_group():
    for seen in run_ranks(_lifecycle, 2, init=False, timeout=60):
        for name in ("before-init", "new_group-before-init", "destroy-before-init", "after-destroy"):
            assert seen[name] == ("ValueError", _NOT_INIT + "."), (name, seen[name])
        for name in ("destroyed-subgroup", "destroyed-subgroup-async"):
            assert seen[name] == ("ValueError", "group: process group '1' has been destroyed"), seen[name]
        assert seen["world-after"] == [3.0, 3.0] and seen["reinit"] == [3.0, 3.0]
