"""ndist.multiprocessing as a drop-in for multiprocessing; the statements of the
torch.multiprocessing page (seed 001), with torch replaced by ndist."""

import gc
import multiprocessing
import os
import subprocess
import sys

import numpy as np
import pytest

import ndist.multiprocessing as mp

from tests.runtime.multiprocessing import _mp_workers as w


def test_every_stdlib_name_is_there():
    missing = [n for n in multiprocessing.__all__ if not hasattr(mp, n)]
    assert missing == []
    assert set(multiprocessing.__all__) <= set(mp.__all__)
    for name in ("spawn", "start_processes", "ProcessContext", "ProcessRaisedException",
                 "ProcessExitedException", "get_all_sharing_strategies", "get_sharing_strategy",
                 "set_sharing_strategy"):
        assert name in mp.__all__ and hasattr(mp, name)


@pytest.mark.timeout(120)
def test_drop_in_queue_process_and_pool_work_as_in_the_stdlib():
    ctx = mp.get_context("spawn")
    with ctx.Pool(2) as pool:
        assert pool.map(abs, [-1, -2, 3]) == [1, 2, 3]
    q, done = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=w.add_one_in_place, args=(np.zeros(2), done))
    p.start()
    assert done.get(timeout=60) == ("ok", 2.0)
    p.join(60)
    assert p.exitcode == 0


def test_get_all_sharing_strategies_is_the_supported_set():
    strategies = mp.get_all_sharing_strategies()
    assert isinstance(strategies, set)
    assert "file_system" in strategies
    if sys.platform.startswith("linux"):
        assert strategies == {"file_descriptor", "file_system"}


def test_get_and_set_sharing_strategy():
    old = mp.get_sharing_strategy()
    assert old in mp.get_all_sharing_strategies()
    try:
        for name in mp.get_all_sharing_strategies():
            mp.set_sharing_strategy(name)
            assert mp.get_sharing_strategy() == name
    finally:
        mp.set_sharing_strategy(old)
    with pytest.raises(ValueError, match=r"\['file_descriptor', 'file_system'\].*'shm'"):
        mp.set_sharing_strategy("shm")
    assert mp.get_sharing_strategy() == old


_Tensor = getattr(__import__("ndist.tensor", fromlist=["x"]), "Tensor", None)


@pytest.mark.skipif(_Tensor is None, reason="the tensor layer has not landed in this checkout")
def test_set_sharing_strategy_changes_where_share_memory_puts_tensors():
    from ndist.tensor import Tensor, _shm

    old = mp.get_sharing_strategy()
    try:
        mp.set_sharing_strategy("file_system")
        t = Tensor._wrap(np.ones(10)).share_memory_()
        assert _shm.segment_of(t._data)[0].strategy == "file_system"
        assert len(w.shm_names(os.getpid())) >= 1
        if "file_descriptor" in mp.get_all_sharing_strategies():
            mp.set_sharing_strategy("file_descriptor")
            u = Tensor._wrap(np.ones(10)).share_memory_()
            assert _shm.segment_of(u._data)[0].strategy == "file_descriptor"
        del t
        gc.collect()
        assert w.shm_names(os.getpid()) == []
    finally:
        mp.set_sharing_strategy(old)


def test_import_stays_light():
    code = "import sys, ndist.multiprocessing; print('cupy' in sys.modules, 'mpi4py' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "False"]
