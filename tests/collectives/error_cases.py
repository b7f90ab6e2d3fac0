"""Bad calls and the error each one raises, before anything is sent.

Each case is run on every rank of a 2-rank job (every rank's call is bad, so
no rank enters a collective); the test asserts the error's type and message
and that a valid collective on the same group succeeds afterwards.
docs/errors.md lists the same cases (a test keeps the two in sync).
"""

from __future__ import annotations

import re
import traceback

import numpy as np

from tests.collectives.collective_launch import usable_after

CASES: list = []


def bad(case_id: str, exc: type, pattern: str):
    def deco(fn):
        CASES.append((case_id, fn, exc, pattern))
        return fn

    return deco


Z = np.zeros


def _single(case_id: str, exc: type, pattern: str, out, inp, **splits) -> None:
    """A case of ``all_to_all_single(Z(out), Z(inp), **splits)``; a split given as a function
    of the rank is that rank's."""

    def call(d, r, n):
        d.all_to_all_single(Z(out), Z(inp), **{k: v(r) if callable(v) else v for k, v in splits.items()})

    bad(case_id, exc, pattern)(call)


for _case in [
    ("split-sum", ValueError, r"input_split_sizes: sizes \[1, 2\] sum to 3, but dim 0 of input has 4 rows",
     4, 4, dict(input_split_sizes=[1, 2])),
    ("output-split-sum", ValueError, r"output_split_sizes: sizes \[3, 3\] sum to 6, but dim 0 of output has 4 rows",
     4, 4, dict(output_split_sizes=[3, 3])),
    ("split-negative", ValueError, r"input_split_sizes\[0\]: expected a size >= 0, got -1",
     4, 4, dict(input_split_sizes=[-1, 5])),
    ("split-length", ValueError, r"input_split_sizes: expected 2 sizes \(the group size\), got 1: \[4\]",
     4, 4, dict(input_split_sizes=[4])),
    ("split-type", TypeError, r"input_split_sizes\[0\]: expected an int, got float",
     4, 4, dict(input_split_sizes=[1.5, 2.5])),
    ("split-indivisible", ValueError,
     r"input_split_sizes: not given, so dim 0 of input \(3\) must divide evenly by the group size 2",
     4, 3, dict(output_split_sizes=[2, 2])),
    ("split-self-mismatch", ValueError, r"output_split_sizes\[\d\]: expected \d \(input_split_sizes\[\d\]",
     4, 4, dict(output_split_sizes=lambda r: [1, 3] if r == 0 else [3, 1], input_split_sizes=[2, 2])),
    ("single-0d", ValueError, r"output: expected a tensor with at least one dimension, got a 0-d tensor",
     (), (), {}),
    ("single-trailing-shape", ValueError,
     r"output: expected trailing dimensions \(3,\) \(those of input\), got shape \(2, 2\)", (2, 2), (2, 3), {}),
]:
    _single(*_case[:5], **_case[5])


@bad("all_to_all-list-length", ValueError, r"output_tensor_list: expected a list of 2 tensors \(the group size\), got 1")
def _(d, r, n):
    d.all_to_all([Z(1)], [Z(1), Z(1)])


@bad("all_to_all-seed-int64-output", TypeError, r"output_tensor_list\[0\]: expected dtype complex64 \(the dtype of input_tensor_list\[0\]\), got int64")
def _(d, r, n):
    inp = list((np.array([1 + 1j, 2 + 2j], np.complex64)).reshape(2, 1))
    d.all_to_all(list(np.empty([2], np.int64).reshape(2, 1)), inp)


@bad("seed-page-complex-into-int64", TypeError, r"output_tensor_list\[0\]: expected dtype complex64 \(the dtype of input_tensor_list\[0\]\), got int64")
def _(d, r, n):
    import ndist  # the seed page's complex example, verbatim: its output is built from an int64 tensor

    inp = ndist.tensor([1 + 1j, 2 + 2j], dtype=ndist.cfloat) + 2 * r * (1 + 1j)
    d.all_to_all(list(ndist.empty([2], dtype=ndist.int64).chunk(2)), list(inp.chunk(2)))


@bad("all_to_all-not-a-list", TypeError, r"output_tensor_list: expected a list of tensors, got ndarray")
def _(d, r, n):
    d.all_to_all(Z(2), [Z(1), Z(1)])


@bad("all_to_all-self-size", ValueError, r"output_tensor_list\[\d\]: expected 2 elements")
def _(d, r, n):
    d.all_to_all([Z(1), Z(1)], [Z(2), Z(2)])


@bad("all_gather-list-length", ValueError, r"tensor_list: expected a list of 2 tensors \(the group size\), got 3")
def _(d, r, n):
    d.all_gather([Z(1)] * 3, Z(1))


@bad("all_gather-dtype", TypeError, r"tensor_list\[1\]: expected dtype float64 \(the dtype of tensor\), got float32")
def _(d, r, n):
    d.all_gather([Z(1), Z(1, np.float32)], Z(1))


@bad("all_gather-own-size", ValueError, r"tensor_list\[\d\]: expected 3 elements \(those of tensor")
def _(d, r, n):
    d.all_gather([Z(2), Z(2)], Z(3))


@bad("all_gather_into_tensor-size", ValueError, r"output_tensor: expected 6 elements \(input_tensor's 3 x group size 2\), got 5")
def _(d, r, n):
    d.all_gather_into_tensor(Z(5), Z(3))


@bad("reduce_scatter_tensor-size", ValueError, r"input: expected 4 elements \(output's 2 x group size 2\), got 3")
def _(d, r, n):
    d.reduce_scatter_tensor(Z(2), Z(3))


@bad("reduce_scatter-own-size", ValueError, r"input_list\[\d\]: expected 2 elements \(those of output\), got 1")
def _(d, r, n):
    d.reduce_scatter(Z(2), [Z(1), Z(1)])


@bad("src-outside-group", ValueError, r"src: expected a global rank in group \[0, 1\], got 5")
def _(d, r, n):
    d.broadcast(Z(1), src=5)


@bad("src-type", TypeError, r"src: expected an int rank, got str \('0'\)")
def _(d, r, n):
    d.broadcast(Z(1), src="0")


@bad("src-and-group_src", ValueError, r"src and group_src: expected at most one of them, got src=0 and group_src=0")
def _(d, r, n):
    d.broadcast(Z(1), src=0, group_src=0)


@bad("group_src-range", ValueError, r"group_src: expected a group rank in \[0, 2\), got 2")
def _(d, r, n):
    d.broadcast(Z(1), group_src=2)


@bad("dst-missing", ValueError, r"dst: expected a global rank of group \[0, 1\] \(or group_dst\), got None")
def _(d, r, n):
    d.reduce(Z(1))


def _op_on(case_id: str, pattern: str, dtype, op: str) -> None:
    """A case of ``all_reduce(Z(2, dtype), ReduceOp.<op>)``: an op the dtype does not have."""

    def call(d, r, n):
        d.all_reduce(Z(2, dtype), getattr(d.ReduceOp, op))

    bad(case_id, ValueError, pattern)(call)


for _case in [
    ("max-on-complex", r"op: MAX is not defined on complex tensors \(dtype complex128\)", np.complex128, "MAX"),
    ("band-on-float", r"op: BAND needs an integer or bool tensor, got dtype float32", np.float32, "BAND"),
    ("bxor-on-float16", r"op: BXOR needs an integer or bool tensor, got dtype float16", np.float16, "BXOR"),
    ("avg-on-bool", r"op: AVG needs an integer, floating-point or complex tensor, got dtype bool", np.bool_, "AVG"),
    ("premul-without-factor", r"op: ReduceOp.PREMUL_SUM needs its factor", np.float64, "PREMUL_SUM"),
]:
    _op_on(*_case)


@bad("premul-factor-type", TypeError, r"op: PREMUL_SUM factor: expected a number or a one-element tensor, got str")
def _(d, r, n):
    d.all_reduce(Z(2), d._make_nccl_premul_sum("2"))


@bad("premul-factor-shape", TypeError, r"PREMUL_SUM factor: expected a number or a one-element numeric tensor, got a tensor of shape \(2,\)")
def _(d, r, n):
    d.all_reduce(Z(2), d._make_nccl_premul_sum(np.ones(2)))


@bad("premul-on-int", ValueError, r"op: PREMUL_SUM needs a floating-point or complex tensor, got dtype int32")
def _(d, r, n):
    d.all_reduce(Z(2, np.int32), d._make_nccl_premul_sum(2.0))


@bad("op-type", TypeError, r"op: expected a ndist.distributed.ReduceOp, got str \('sum'\)")
def _(d, r, n):
    d.all_reduce(Z(2), "sum")


@bad("tensor-type", TypeError, r"tensor: expected a tensor \(ndist.Tensor, numpy/cupy array, torch tensor\), got list")
def _(d, r, n):
    d.all_reduce([1.0, 2.0])


@bad("async_op-type", TypeError, r"async_op: expected a bool, got str \('yes'\)")
def _(d, r, n):
    d.all_reduce(Z(2), async_op="yes")


@bad("read-only-output", ValueError, r"tensor: expected a writable tensor, got a read-only array of shape \(3,\)")
def _(d, r, n):
    d.all_reduce(np.broadcast_to(np.zeros(1), (3,)))


@bad("send-to-self", ValueError, r"dst: expected a peer other than this process \(rank \d\), got itself")
def _(d, r, n):
    d.send(Z(1), dst=r)


@bad("tag-negative", ValueError, r"tag: expected an int in \[0, 32767\), got -1")
def _(d, r, n):
    d.send(Z(1), dst=1 - r, tag=-1)


@bad("tag-type", TypeError, r"tag: expected an int, got str \('a'\)")
def _(d, r, n):
    d.isend(Z(1), dst=1 - r, tag="a")


@bad("gather-list-on-root-and-elsewhere", ValueError, r"gather_list: expected (a list of 2 tensors|None or \[\] on non-root rank 1)")
def _(d, r, n):
    d.gather(Z(1), [Z(1)], dst=0)


@bad("scatter-list-missing-on-root", ValueError, r"scatter_list: expected (a list of 2 tensors on the root rank 0, got None|None or \[\] on non-root rank 1)")
def _(d, r, n):
    d.scatter(Z(1), None if r == 0 else [Z(1), Z(1)], src=0)


@bad("batch-empty", ValueError, r"p2p_op_list: expected a non-empty list of P2POp, got \[\]")
def _(d, r, n):
    d.batch_isend_irecv([])


@bad("batch-element-type", TypeError, r"p2p_op_list\[0\]: expected a P2POp, got tuple")
def _(d, r, n):
    d.batch_isend_irecv([(d.isend, Z(1), 1 - r)])


@bad("p2pop-op", ValueError, r"op: expected ndist.distributed.isend or irecv, got <function send")
def _(d, r, n):
    d.P2POp(d.send, Z(1), 1 - r)


@bad("all_gather_object-length", ValueError, r"object_list: expected a list of 2 items \(the group size\), got 1")
def _(d, r, n):
    d.all_gather_object([None], r)


@bad("scatter_object_list-empty-output", ValueError, r"scatter_object_output_list: expected a list with at least one element, got \[\]")
def _(d, r, n):
    d.scatter_object_list([], [1, 2], src=0)


@bad("broadcast_object_list-type", TypeError, r"object_list: expected a list, got tuple")
def _(d, r, n):
    d.broadcast_object_list((1, 2), src=0)


@bad("monitored_barrier-timeout", ValueError, r"timeout: expected a positive, finite duration, got -1")
def _(d, r, n):
    d.monitored_barrier(timeout=-1)


@bad("barrier-device_ids-type", TypeError, r"device_ids: expected a list of ints or None, got int")
def _(d, r, n):
    d.barrier(device_ids=0)


@bad("all_to_all_single-dtype", TypeError, r"input: expected dtype float32 \(the dtype of output\), got float64")
def _(d, r, n):
    d.all_to_all_single(Z(2, np.float32), Z(2, np.float64))


@bad("reduce_scatter_tensor-dtype", TypeError, r"input: expected dtype float32 \(the dtype of output\), got int64")
def _(d, r, n):
    d.reduce_scatter_tensor(Z(1, np.float32), Z(2, np.int64))


@bad("dst-outside-group", ValueError, r"dst: expected a global rank in group \[0, 1\], got 5")
def _(d, r, n):
    d.gather(Z(1), None, dst=5)


@bad("min-on-complex", ValueError, r"op: MIN is not defined on complex tensors \(dtype complex64\)")
def _(d, r, n):
    d.all_reduce(Z(2, np.complex64), d.ReduceOp.MIN)


@bad("bor-on-float64", ValueError, r"op: BOR needs an integer or bool tensor, got dtype float64")
def _(d, r, n):
    d.all_reduce(Z(2), d.ReduceOp.BOR)


@bad("group-rank-not-member", ValueError, r"global_rank: rank 5 is not part of group '0' with ranks \[0, 1\]")
def _(d, r, n):
    d.get_group_rank(d.group.WORLD, 5)


@bad("new_group-rank-outside-world", ValueError, r"ranks: expected global ranks in \[0, 2\), got 5")
def _(d, r, n):
    d.new_group([0, 5])


@bad("new_group-duplicate-rank", ValueError, r"ranks: expected distinct ranks, got \[0, 0\]")
def _(d, r, n):
    d.new_group([0, 0])


@bad("double-init", RuntimeError, r"trying to initialize the default process group twice")
def _(d, r, n):
    d.init_process_group(d.get_backend())


_NUMERIC = r"expected a tensor of a bool, integer, floating-point or complex dtype, got dtype "


@bad("dtype-unicode", TypeError, r"tensor: " + _NUMERIC + r"<U3")
def _(d, r, n):
    d.all_reduce(np.array(["abc", "def"]))


@bad("dtype-object", TypeError, r"tensor: " + _NUMERIC + r"object")
def _(d, r, n):
    d.broadcast(np.array([1, None], dtype=object), src=0)


@bad("dtype-datetime", TypeError, r"tensor: " + _NUMERIC + r"datetime64\[s\]")
def _(d, r, n):
    d.all_gather([Z(2, "M8[s]"), Z(2, "M8[s]")], Z(2, "M8[s]"))


@bad("dtype-timedelta-send", TypeError, r"tensor: " + _NUMERIC + r"timedelta64\[ms\]")
def _(d, r, n):
    d.send(Z(2, "m8[ms]"), dst=1 - r)


@bad("dtype-void-recv", TypeError, r"tensor: " + _NUMERIC + r"\|V8")
def _(d, r, n):
    d.recv(Z(2, "V8"), src=1 - r)


@bad("dtype-structured-list", TypeError, r"output_tensor_list\[1\]: " + _NUMERIC + r"\[\('a', '<f4'\)\]")
def _(d, r, n):
    d.all_to_all([Z(1, np.float32), Z(1, [("a", "<f4")])], [Z(1, np.float32), Z(1, np.float32)])


@bad("dtype-bytes-batch", TypeError, r"p2p_op_list\[0\].tensor: " + _NUMERIC + r"\|S2")
def _(d, r, n):
    d.batch_isend_irecv([d.P2POp(d.isend, np.array([b"ab"]), 1 - r)])


@bad("big-endian-broadcast", TypeError, r"tensor: expected native byte order \(little-endian\), got dtype '>f8' \(big-endian\); convert it first: arr.astype\('<f8'\)")
def _(d, r, n):
    d.broadcast(np.zeros(2, ">f8"), src=0)


@bad("big-endian-in-list", TypeError, r"tensor_list\[1\]: expected native byte order \(little-endian\), got dtype '>i4'")
def _(d, r, n):
    d.all_gather([Z(2, np.int32), np.zeros(2, ">i4")], Z(2, np.int32))


_FORMATS = r"expected a buffer of format b, B, h, H, i, I, l, L, q, Q, e, f, d, \?, Zf, Zd \(struct's codes, native byte order\)"


@bad("buffer-format", TypeError, r"tensor: " + _FORMATS + r", got format 'c' \(memoryview\)")
def _(d, r, n):
    d.all_reduce(memoryview(bytearray(4)).cast("c"))


@bad("buffer-format-input", TypeError, r"input: " + _FORMATS + r", got format 'P' \(memoryview\)")
def _(d, r, n):
    d.all_to_all_single(bytearray(4), memoryview(bytearray(32)).cast("P"))


@bad("buffer-big-endian", TypeError, r"tensor: expected native byte order \(little-endian\), got format '>i' \(memoryview, big-endian\)")
def _(d, r, n):
    d.broadcast(memoryview(np.zeros(2, ">i4")), src=0)


@bad("buffer-read-only-output", ValueError, r"output_tensor: expected a writable tensor, got a read-only bytes of shape \(4,\)")
def _(d, r, n):
    d.all_gather_into_tensor(b"abcd", bytearray(2))


@bad("buffer-read-only-memoryview", ValueError, r"tensor: expected a writable tensor, got a read-only memoryview of shape \(3,\)")
def _(d, r, n):
    d.all_reduce(memoryview(bytearray(3)).toreadonly())


@bad("buffer-dtype-mismatch", TypeError, r"input: expected dtype uint8 \(the dtype of output\), got float32")
def _(d, r, n):
    d.reduce_scatter_tensor(bytearray(2), memoryview(bytearray(16)).cast("f"))


try:
    import _testbuffer  # CPython's exporter of every buffer layout (a build may leave it out)
except ImportError:  # pragma: no cover - present in the CPython builds CI runs
    _testbuffer = None

if _testbuffer is not None:

    @bad("buffer-suboffsets", TypeError, r"tensor: expected a buffer without suboffsets \(one block of memory, any "
         r"strides\), got ndarray with suboffsets \(0,\) \(an indirect, PIL-style buffer")
    def _(d, r, n):
        d.all_reduce(_testbuffer.ndarray([0] * 4, shape=[4], format="B",
                                         flags=_testbuffer.ND_PIL | _testbuffer.ND_WRITABLE))


def run_cases(dist) -> dict:
    """``{case_id: None or what went wrong}``, on this rank."""
    rank, size = dist.get_rank(), dist.get_world_size()
    results = {}
    for case_id, fn, exc, pattern in CASES:
        problem = None
        try:
            fn(dist, rank, size)
        except exc as err:
            if not re.search(pattern, str(err)):
                problem = f"message {str(err)!r} does not match {pattern!r}"
        except Exception:  # noqa: BLE001
            problem = f"raised the wrong type (expected {exc.__name__}):\n{traceback.format_exc()}"
        else:
            problem = f"did not raise {exc.__name__}"
        results[case_id] = usable_after(dist, problem)
    return results


def entry(rank=None, world_size=None, device="cpu") -> dict:
    import ndist.distributed as dist

    return run_cases(dist)
