"""AVG's integer division (collectives/_intavg.py): exact, toward zero, any group size."""

from __future__ import annotations

import numpy as np
import pytest

from ndist.collectives._intavg import truncating_divide

INTS = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]


def _toward_zero(v: int, n: int) -> int:
    return abs(v) // n * (-1 if v < 0 else 1)


def _edges(dtype) -> list[int]:
    info = np.iinfo(dtype)
    lo, hi = int(info.min), int(info.max)
    vals = [0, 1, 2, 3, 5, 7, hi, hi - 1, hi - 2, hi // 2, lo, lo + 1, lo + 2]
    if lo < 0:
        vals += [-1, -2, -3, -5, -7, lo // 2, lo // 3]
    return vals


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("size", [1, 2, 3, 4, 7, 8, 127, 128, 200, 255, 256, 1000, 2**31 + 5])
def test_every_edge_value_divides_toward_zero(dtype, size):
    vals = _edges(dtype)
    out = np.array(vals, dtype=dtype)
    truncating_divide(out, size)
    assert out.dtype == np.dtype(dtype)
    assert [int(v) for v in out] == [_toward_zero(v, size) for v in vals]


def test_negative_values_round_toward_zero_not_down():
    out = np.array([-7, -6, -5, -1, 1, 5, 6, 7], np.int32)
    truncating_divide(out, 2)
    assert out.tolist() == [-3, -3, -2, 0, 0, 2, 3, 3]  # floor division would give -4, -3, -3, -1


def test_int64_extremes_are_exact_where_float_division_is_not():
    # 2**63 - 6 in float64 is 2**63: a float division would be off in the last digits
    out = np.array([2**63 - 6, -(2**63), -(2**63) + 1], np.int64)
    truncating_divide(out, 3)
    assert out.tolist() == [(2**63 - 6) // 3, -(2**63 // 3), -((2**63 - 1) // 3)]
    big = np.array([2**64 - 1, 2**64 - 2], np.uint64)
    truncating_divide(big, 3)
    assert big.tolist() == [(2**64 - 1) // 3, (2**64 - 2) // 3]


def test_in_place_on_a_view_and_empty():
    base = np.array([[-9, 100], [9, -100]], np.int16)
    truncating_divide(base[:, 0], 4)  # a strided view: only its elements change
    assert base.tolist() == [[-2, 100], [2, -100]]
    empty = np.zeros(0, np.int8)
    truncating_divide(empty, 3)
    assert empty.shape == (0,)
