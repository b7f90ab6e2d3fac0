"""The soak run of ``tools/trials/soak.py`` at a smaller count (500 random collectives on
4 ranks: ops, dtypes, empty and uneven sizes, subgroups, async), every result checked
against NumPy. The full 10,000: ``python tools/trials/soak.py``."""

import importlib.util
from pathlib import Path

import pytest

from ndist.testing import run_ranks

ROOT = Path(__file__).resolve().parents[2]


def _soak_module():
    import sys

    import cloudpickle

    if "ndist_soak" in sys.modules:
        return sys.modules["ndist_soak"]
    spec = importlib.util.spec_from_file_location("ndist_soak", ROOT / "tools" / "trials" / "soak.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["ndist_soak"] = mod
    spec.loader.exec_module(mod)
    cloudpickle.register_pickle_by_value(mod)  # the ranks cannot import tools/trials/
    return mod


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("transport,seed", [("auto", 1), ("tcp", 2)])
def test_soak_500_random_collectives_on_4_ranks(transport, seed):
    soak = _soak_module()
    res = run_ranks(soak.soak_rank, 4, args=(500, seed), timeout=200, transport=transport)
    trials = sum(r[0] for r in res)
    assert trials > 1000  # every op runs on 2-4 ranks
    assert [r[1] for r in res] == [0, 0, 0, 0], [r[2] for r in res]


def test_the_checker_catches_a_wrong_result():
    soak = _soak_module()
    import numpy as np

    a = [np.array([1, 2], np.int32), np.array([3, -1], np.int32)]
    assert soak._close(soak._reduce(a, "SUM", "int32"), np.array([4, 1], np.int32), "int32")
    assert not soak._close(soak._reduce(a, "MAX", "int32"), np.array([3, 1], np.int32), "int32")
    assert not soak._close(np.zeros(3, np.float32), np.zeros(2, np.float32), "float32")
