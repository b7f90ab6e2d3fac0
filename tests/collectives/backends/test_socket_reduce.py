"""The socket backend's reduction kernel: rank order, and overflow as a result, not a warning."""

import warnings

import numpy as np
import pytest

from ndist.collectives._reduce_op import ReduceOp
from ndist.collectives.backends.socket.schedules import _reduce


@pytest.mark.parametrize("raise_mode", [None, "raise"])
def test_float_overflow_gives_inf_without_warning_and_leaves_the_callers_error_state(raise_mode):
    old = np.seterr(all=raise_mode) if raise_mode else np.geterr()
    try:
        before = np.geterr()
        a = np.full(4, 3e38, np.float32)
        b = np.full(4, 3e38, np.float32)
        out = np.empty(4, np.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _reduce.reduce_ordered(out, [a, b, a], ReduceOp.SUM)
            _reduce.reduce_ordered(out, [out, a], ReduceOp.PRODUCT)
        assert np.isinf(out).all()
        assert np.geterr() == before  # the caller's setting is back
        with pytest.raises(FloatingPointError) if raise_mode else pytest.warns(RuntimeWarning):
            np.add(a, b)  # the caller's own arithmetic still follows its setting
    finally:
        np.seterr(**old)


def test_reduction_runs_in_rank_order_into_the_first_contribution():
    c = [np.array([1.0, 2.0]), np.array([10.0, 20.0]), np.array([100.0, 200.0])]
    _reduce.reduce_ordered(c[0], c, ReduceOp.SUM)
    assert c[0].tolist() == [111.0, 222.0]
    out = np.empty(2)
    _reduce.reduce_ordered(out, [np.array([5.0, 1.0]), np.array([2.0, 7.0])], ReduceOp.MAX)
    assert out.tolist() == [5.0, 7.0]
