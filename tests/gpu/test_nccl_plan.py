"""How the nccl backend maps (dtype, ReduceOp) onto NCCL: pure logic, no GPU needed."""

from __future__ import annotations

import pytest

from ndist.collectives import ReduceOp
from ndist.collectives.backends.nccl import _plan
from ndist.collectives.backends.nccl._plan import reduction_plan


@pytest.mark.parametrize("dtype,code", [("int8", 0), ("uint8", 1), ("int32", 2), ("uint32", 3), ("int64", 4),
                                        ("uint64", 5), ("float16", 6), ("float32", 7), ("float64", 8),
                                        ("bfloat16", 9)])
def test_native_dtypes_use_ncclDataType_values(dtype, code):
    plan = reduction_plan(dtype, ReduceOp.SUM)
    assert plan.nccl_dtype == code
    assert plan.view == "same" and not plan.premul and not plan.divide


@pytest.mark.parametrize("op,code", [(ReduceOp.SUM, 0), (ReduceOp.PRODUCT, 1), (ReduceOp.MAX, 2),
                                     (ReduceOp.MIN, 3), (ReduceOp.AVG, 4)])
def test_ops_use_ncclRedOp_values(op, code):
    assert reduction_plan("float32", op).nccl_op == code


@pytest.mark.parametrize("op,nccl_op", [(ReduceOp.SUM, _plan.MAX), (ReduceOp.BOR, _plan.MAX),
                                        (ReduceOp.MAX, _plan.MAX), (ReduceOp.PRODUCT, _plan.MIN),
                                        (ReduceOp.BAND, _plan.MIN), (ReduceOp.MIN, _plan.MIN)])
def test_bool_reduces_as_uint8_logical(op, nccl_op):
    plan = reduction_plan("bool", op)
    assert (plan.nccl_dtype, plan.nccl_op, plan.view, plan.work_dtype) == (_plan.UINT8, nccl_op, "reinterpret",
                                                                           "uint8")


@pytest.mark.parametrize("op", [ReduceOp.AVG, ReduceOp.BXOR, ReduceOp.PREMUL_SUM])
def test_bool_rejects_arithmetic_ops(op):
    with pytest.raises(ValueError, match=r"ReduceOp\.%s.*bool" % op.name):
        reduction_plan("bool", op)


@pytest.mark.parametrize("dtype,real,code", [("complex64", "float32", _plan.FLOAT32),
                                             ("complex128", "float64", _plan.FLOAT64)])
def test_complex_sum_avg_premul_as_real_pairs(dtype, real, code):
    for op, nccl_op in [(ReduceOp.SUM, _plan.SUM), (ReduceOp.AVG, _plan.AVG), (ReduceOp.PREMUL_SUM, _plan.SUM)]:
        plan = reduction_plan(dtype, op)
        assert (plan.nccl_dtype, plan.nccl_op, plan.view, plan.work_dtype, plan.count_factor) == (
            code, nccl_op, "reinterpret", real, 2)
        assert plan.premul is (op is ReduceOp.PREMUL_SUM)


@pytest.mark.parametrize("op", [ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT, ReduceOp.BAND])
def test_complex_rejects_ordered_ops_naming_dtype(op):
    with pytest.raises(ValueError, match="complex64"):
        reduction_plan("complex64", op)


@pytest.mark.parametrize("dtype,work", [("int16", "int32"), ("uint16", "uint32")])
def test_16_bit_integers_reduce_upcast(dtype, work):
    plan = reduction_plan(dtype, ReduceOp.MAX)
    assert (plan.view, plan.work_dtype, plan.nccl_dtype, plan.nccl_op) == (
        "upcast", work, _plan.NCCL_DTYPES[work], _plan.MAX)


@pytest.mark.parametrize("dtype", ["int16", "int32", "uint64"])
@pytest.mark.parametrize("op", [ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR])
def test_bitwise_ops_are_refused_naming_the_user_dtype(dtype, op):
    with pytest.raises(ValueError, match=rf"ReduceOp\.{op.name}.*{dtype}.*bitwise"):
        reduction_plan(dtype, op)


def test_premul_sum_is_scale_then_sum():
    plan = reduction_plan("float16", ReduceOp.PREMUL_SUM)
    assert plan.premul and plan.nccl_op == _plan.SUM


def test_avg_without_ncclAvg_sums_then_divides():
    plan = reduction_plan("float32", ReduceOp.AVG, nccl_version=20907)
    assert plan.nccl_op == _plan.SUM and plan.divide
    assert reduction_plan("float32", ReduceOp.AVG, nccl_version=21000).nccl_op == _plan.AVG
    # integers too: ncclSum wraps as ncclAvg's sum does, and the division is exact (_intavg.py)
    plan = reduction_plan("int32", ReduceOp.AVG, nccl_version=20907)
    assert (plan.nccl_dtype, plan.nccl_op, plan.view, plan.divide) == (_plan.INT32, _plan.SUM, "same", True)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "uint32", "int64", "uint64"])
def test_integer_avg_is_ncclAvg(dtype):
    plan = reduction_plan(dtype, ReduceOp.AVG)
    assert (plan.nccl_dtype, plan.nccl_op, plan.view, plan.divide) == (_plan.NCCL_DTYPES[dtype], _plan.AVG,
                                                                       "same", False)


@pytest.mark.parametrize("dtype,work", [("int16", "int32"), ("uint16", "uint32")])
def test_16_bit_integer_avg_sums_upcast_then_divides_in_16_bits(dtype, work):
    # ncclAvg on the 32-bit copy would divide a sum that never wrapped at 16 bits
    plan = reduction_plan(dtype, ReduceOp.AVG)
    assert (plan.view, plan.work_dtype, plan.nccl_op, plan.divide) == ("upcast", work, _plan.SUM, True)


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "object", "datetime64"])
def test_unknown_dtype_is_a_clear_error(dtype):
    with pytest.raises(ValueError, match=f"dtype {dtype}"):
        reduction_plan(dtype, ReduceOp.SUM)


def test_op_must_be_a_reduce_op():
    with pytest.raises(TypeError, match="op: expected ndist.ReduceOp, got str"):
        reduction_plan("float32", "sum")
