"""Collectives recorded into a CUDA graph at world size 1, and what capture refuses."""

from __future__ import annotations

import pytest

from tests.gpu._gpu import nccl_fixture, require_gpu

cp = require_gpu(nccl=True)

from ndist.collectives import ReduceOp  # noqa: E402
from ndist.collectives._backend import DONE  # noqa: E402
from ndist.collectives.backends.nccl._work import CapturedWork  # noqa: E402
from ndist.runtime import DistCaptureError  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]


be = nccl_fixture("gpu-graph")


def _capture(stream, fn):
    with stream:
        stream.begin_capture()
        try:
            fn()
        finally:
            graph = stream.end_capture()
    return graph


def test_a_captured_all_gather_replays_with_the_current_data(be):
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        inp = cp.zeros(4096, dtype=cp.float32)
        out = cp.zeros(4096, dtype=cp.float32)
        be.all_gather_into(out, inp, blocking=True)  # outside capture once (NCCL connects)
    s.synchronize()
    results = []
    graph = _capture(s, lambda: results.append(be.all_gather_into(out, inp, blocking=True)))
    assert results == [DONE]
    assert be.backend._watchdog.pending() == [] and not be.backend._watchdog.busy()
    for value in (5.0, 7.0):
        with s:
            inp.fill(value)
            graph.launch(stream=s)
        s.synchronize()
        cp.testing.assert_array_equal(out, cp.full(4096, value, dtype=cp.float32))


def test_a_graph_of_100_all_reduces_replays(be):
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        x = cp.ones(1024, dtype=cp.float32)
        be.all_reduce(x, ReduceOp.PREMUL_SUM, scale=2.0, blocking=True)  # warms CuPy's pool on s
    s.synchronize()

    def body():
        for _ in range(10):
            be.all_reduce(x, ReduceOp.PREMUL_SUM, scale=2.0, blocking=True)  # x *= 2, recorded
        for _ in range(90):
            be.all_reduce(x, ReduceOp.SUM, blocking=True)

    graph = _capture(s, body)
    with s:
        x.fill(1.0)
        graph.launch(stream=s)
    s.synchronize()
    cp.testing.assert_array_equal(x, cp.full(1024, 1024.0, dtype=cp.float32))


def test_waits_inside_capture_are_refused_and_the_stream_wait_is_recorded(be):
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        x = cp.ones(256, dtype=cp.float32)
        before = be.all_reduce(x, ReduceOp.SUM)  # issued outside: pending at capture time, maybe
    errors = []

    def body():
        w = be.all_reduce(x, ReduceOp.SUM)
        assert isinstance(w, CapturedWork)
        assert w.wait() is True  # a dependency in the graph
        for call in (lambda: w.wait(10), w.synchronize, w.is_completed, w.get_future):
            with pytest.raises(DistCaptureError, match=r"all_reduce \(#\d+\): Work\.\w+\(\w*\) is not allowed in CUDA "
                                                       r"graph capture: .*recorded into a CUDA graph"):
                call()
        with pytest.raises(DistCaptureError, match=r"nccl barrier: the op is not allowed in CUDA graph capture: "
                                                   r"a barrier waits on the host"):
            be.barrier()
        with pytest.raises(DistCaptureError, match="coalescing block"):
            with be.backend.coalescing():
                pass
        if not before.finished:
            with pytest.raises(DistCaptureError, match=r"Work.synchronize\(\).*stream being captured"):
                before.synchronize()
        errors.append(None)

    graph = _capture(s, body)
    assert errors == [None]
    with s:
        graph.launch(stream=s)
    s.synchronize()
    before.synchronize()
    with pytest.raises(DistCaptureError, match="runs at each replay"):
        CapturedWork("all_reduce", 1, cp.cuda.Event()).wait()
