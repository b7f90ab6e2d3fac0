"""The CUDA graph capture rules (``ndist.collectives._capture``), checked without a GPU.

What records into a graph and which waits are refused is a pure table; the real capture
and replay run in tests/gpu/test_nccl_graph.py.
"""

from __future__ import annotations

import pytest

import ndist.distributed as dist
from ndist.collectives import _capture
from ndist.runtime import DistBackendError, DistCaptureError


def test_the_nccl_backend_records_every_collective_but_those_that_need_the_host():
    for op in ("all_reduce", "reduce", "reduce_scatter", "broadcast", "all_gather", "gather", "scatter",
               "all_to_all", "send", "recv"):
        assert _capture.op_refusal(op, staged=False) is None, op
    assert "waits on the host" in _capture.op_refusal("barrier", staged=False)
    assert "coalescing block" in _capture.op_refusal("coalescing", staged=False)
    with pytest.raises(ValueError, match=r"op: expected one of .*'all_reduce'.*got 'allreduce'"):
        _capture.op_refusal("allreduce", staged=False)


@pytest.mark.parametrize("op", ["all_reduce", "broadcast", "send", "barrier"])
def test_a_host_staged_op_is_always_refused(op):
    why = _capture.op_refusal(op, staged=True)
    assert "host-staged" in why and "CPU" in why and "nccl backend" in why


@pytest.mark.parametrize("method", sorted(_capture.REFUSED_WAITS))
def test_host_waits_are_refused_on_a_pending_op_during_capture_and_on_a_captured_op(method):
    assert _capture.wait_refusal(method, captured=False, capturing=True, finished=False) is not None
    assert _capture.wait_refusal(method, captured=True, capturing=True, finished=False) is not None
    assert "replay" in _capture.wait_refusal(method, captured=True, capturing=False, finished=False)
    # outside capture, or on an op that already finished: nothing to refuse
    assert _capture.wait_refusal(method, captured=False, capturing=False, finished=False) is None
    assert _capture.wait_refusal(method, captured=False, capturing=True, finished=True) is None


def test_a_stream_wait_is_allowed_inside_the_capture_that_recorded_the_op():
    assert _capture.wait_refusal("wait", captured=True, capturing=True, finished=False) is None
    assert _capture.wait_refusal("wait", captured=False, capturing=False, finished=False) is None
    assert "replay" in _capture.wait_refusal("wait", captured=True, capturing=False, finished=False)
    assert "before the capture began" in _capture.wait_refusal("wait", captured=False, capturing=True,
                                                              finished=False)
    assert _capture.wait_refusal("wait", captured=False, capturing=True, finished=True) is None
    with pytest.raises(ValueError, match=r"method: expected 'wait' or one of .*got 'join'"):
        _capture.wait_refusal("join", captured=False, capturing=True, finished=False)


def test_work_methods_are_named_as_called():
    assert _capture.work_method("synchronize") == "Work.synchronize()"
    assert _capture.work_method("wait(timeout)") == "Work.wait(timeout)"


def test_the_error_names_the_op_what_was_refused_and_why():
    err = _capture.capture_error("nccl all_reduce", 7, "Work.synchronize()", "it blocks the host")
    assert isinstance(err, DistCaptureError) and isinstance(err, DistBackendError) and isinstance(err, RuntimeError)
    assert str(err) == ("nccl all_reduce (#7): Work.synchronize() is not allowed in CUDA graph capture: "
                        "it blocks the host")
    assert dist.DistCaptureError is DistCaptureError
    assert DistCaptureError.__module__ == "ndist.distributed"
