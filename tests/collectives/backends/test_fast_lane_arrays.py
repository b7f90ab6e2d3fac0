"""The repeated call in one C call (``_cnative.FastLane``, native/clane.c's ``read_arg``) with arrays
other than ``numpy.ndarray``: an ``ndist.Tensor``, an object known only by DLPack (another
library's array), objects that only export the buffer protocol (bytearray, memoryview,
array.array) and, marked ``torch``, torch CPU tensors. Each kind the lane takes runs in one
C call (no Python function of ndist's but the public one's file runs: ``sys.setprofile``) with
the Python engine's results; each kind it does not take (read-only, a legacy DLPack producer,
another device, a non-contiguous view, an empty tensor, a negative or meta tensor, a torch
without DLPack's exchange table) gets the Python path's behaviour and errors; the lane holds
nothing of the caller's after the call."""

from __future__ import annotations

import array
import mmap
import os
import sys
import weakref

import numpy as np
import pytest

from ndist.testing import run_ranks

pytest.importorskip("ndist.collectives.backends.socket.native._cnative")

ENGINES = [{"NDIST_ENGINE": "native"}, {"NDIST_ENGINE": "python"}]
K = 4  # elements per rank


class Exported:
    """An array known only by DLPack, as another library's (``__dlpack__``, ``__dlpack_device__``);
    ``legacy``: a producer without DLPack 1.0's keywords; ``exports`` counts its exports."""

    def __init__(self, arr, device=(1, 0), legacy=False):
        self.arr, self.device, self.legacy, self.exports = arr, device, legacy, 0

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if self.legacy and max_version is not None:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        self.exports += 1
        return self.arr.__dlpack__(max_version=max_version) if max_version else self.arr.__dlpack__()

    def __dlpack_device__(self):
        return self.device


class Sub(np.ndarray):
    pass


def _one_c_call(fn) -> bool:
    """``fn()`` ran no Python function of ndist's but in the public functions' file."""
    return _files(fn) == {"collectives/_api.py"}


def _files(fn) -> set:
    """The files of ndist's (``collectives/_api.py``...) in which ``fn()`` called a Python function."""
    import ndist

    pkg = os.path.dirname(ndist.__file__) + os.sep
    seen = set()

    def hook(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(pkg):
            seen.add(os.path.relpath(frame.f_code.co_filename, pkg).replace(os.sep, "/"))

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def _wrapping(wrap):
    """``make`` for ``_every_op``: float32 NumPy memory, passed as ``wrap(array)``."""
    def make(k):
        a = np.empty(k, np.float32)
        return a, wrap(a)
    return make


def _buffer(kind):
    """``make`` for ``_every_op``: an object of ``kind`` that owns its memory and only exports the
    buffer protocol, with a NumPy view of that memory (bytearray and mmap: uint8, the others float32)."""
    def make(k):
        obj = {"bytearray": lambda: bytearray(k), "array.array": lambda: array.array("f", bytes(4 * k)),
               "memoryview": lambda: memoryview(bytearray(4 * k)).cast("f"), "mmap": lambda: mmap.mmap(-1, k)}[kind]()
        return np.frombuffer(obj, np.uint8 if kind in ("bytearray", "mmap") else np.float32), obj
    return make


BUFFERS = ("bytearray", "array.array", "memoryview", "mmap")


def _every_op(dist, make, r, n) -> dict:
    """The six buffer ops (all_to_all_single even and uneven) on objects ``make(k)`` gives with a
    NumPy view of their memory (reset before each call), each called twice (the first teaches the
    lane the type and dtype), the second traced: ``{op: (result, ran in one C call, ran on the
    Python lane: _plain.py without the general path's _check.py)}``."""
    (full, wf), (part, wp), (out, wo), (pout, wpo) = make(K * n), make(K), make(K * n), make(K)
    w = {"full": wf, "part": wp, "out": wo, "pout": wpo}
    splits = [K + n - 1 if q == r else K - 1 for q in range(n)]  # (this rank keeps more than it sends)

    def fill(a, base):
        return lambda: a.__setitem__(slice(None), (np.arange(a.size) + base).astype(a.dtype))

    ops = {
        "all_reduce": (fill(full, r), lambda: dist.all_reduce(w["full"]), full),
        "broadcast": (fill(full, 10 * r), lambda: dist.broadcast(w["full"], n - 1), full),
        "all_to_all_single": (fill(full, 100 * r), lambda: dist.all_to_all_single(w["out"], w["full"]), out),
        "all_to_all_single uneven": (fill(full, 50 * r),
                                     lambda: dist.all_to_all_single(w["out"], w["full"], splits, splits), out),
        "all_gather_into_tensor": (fill(part, r), lambda: dist.all_gather_into_tensor(w["out"], w["part"]), out),
        "reduce_scatter_tensor": (fill(full, r), lambda: dist.reduce_scatter_tensor(w["pout"], w["full"]), pout),
    }
    res = {}
    for name, (reset, call, result) in ops.items():
        reset()
        call()
        reset()
        files = _files(call)
        res[name] = (result.tolist(), files == {"collectives/_api.py"},
                     "collectives/_plain.py" in files and "collectives/_check.py" not in files)
    return res


def _error(fn):
    try:
        fn()
    except Exception as exc:  # the Python path's own error, whatever it is
        return f"{type(exc).__name__}: {exc}"
    return None


def _gone(make) -> bool:
    """The array ``make(dist)`` passed is freed once the call returned (nothing kept by the lane)."""
    import gc

    refs = make()
    gc.disable()  # freed by its reference count, not by a collection
    try:
        return all(ref() is None for ref in refs)
    finally:
        gc.enable()


def _freed_after(dist, factory):
    def make():
        obj, arr = factory()
        dist.all_reduce(obj)
        dist.all_reduce(obj)
        return [weakref.ref(obj), weakref.ref(arr)] if arr is not obj else [weakref.ref(obj)]
    return make


def _other_arrays(rank, size):
    import ndist
    import ndist.distributed as dist
    from ndist.runtime import world

    dist.barrier()
    a = np.ones(8, np.float32)
    dist.all_reduce(a)
    dist.all_reduce(a)  # the group's lane is made
    got = {"kind": type(world.default.fast).__name__}
    got["ndist.Tensor"] = _every_op(dist, _wrapping(ndist.from_numpy), rank, size)
    got["dlpack"] = _every_op(dist, _wrapping(Exported), rank, size)
    for kind in BUFFERS:
        got[kind] = _every_op(dist, _buffer(kind), rank, size)
    # what the lane does not take: the Python path's own errors
    ro = np.ones(K, np.float32)
    ro.flags.writeable = False
    got["read-only dlpack"] = _error(lambda: dist.all_reduce(Exported(ro)))
    legacy = Exported(np.ones(K, np.float32), legacy=True)
    got["legacy dlpack"] = _error(lambda: dist.all_reduce(legacy))
    gpu = Exported(np.ones(K, np.float32), device=(2, 0))
    got["other device"] = (_error(lambda: dist.all_reduce(gpu)), gpu.exports)
    strided = Exported(np.ones(2 * K, np.float32)[::2])
    got["strided dlpack"] = (_error(lambda: dist.all_reduce(strided)), strided.arr.tolist())
    got["ndist.Tensor strided"] = _one_c_call(lambda: dist.all_reduce(ndist.ones(2 * K)[::2]))
    sub = np.arange(K, dtype=np.float32).view(Sub)  # an ndarray subclass: NumPy's layout too
    dist.all_reduce(sub)
    got["ndarray subclass"] = (_one_c_call(lambda: dist.all_reduce(sub)), sub.tolist())

    def exported():
        arr = np.ones(K, np.float32)
        return Exported(arr), arr

    def tensor():
        arr = np.ones(K, np.float32)
        return ndist.from_numpy(arr), arr

    got["freed"] = (_gone(_freed_after(dist, exported)), _gone(_freed_after(dist, tensor)))
    # buffers the lane does not take: the Python path's behaviour and errors
    got["read-only memoryview"] = _error(lambda: dist.all_reduce(memoryview(bytearray(K)).toreadonly()))
    got["bytes input"] = _error(lambda: dist.all_gather_into_tensor(bytearray(K * size), bytes(range(K))))
    got["unknown format"] = _error(lambda: dist.all_reduce(memoryview(bytearray(K)).cast("c")))
    got["big-endian"] = _error(lambda: dist.all_reduce(memoryview(np.ones(K, ">f4"))))
    base = np.ones(2 * K, np.float32)
    got["strided memoryview"] = (_error(lambda: dist.all_reduce(memoryview(base)[::2])), base.tolist())
    # every buffer let go after the call: a bytearray with an export cannot grow, a memoryview with
    # one cannot be released (BufferError)
    ba = bytearray(K)
    dist.all_reduce(ba)
    ba.extend(b"\0" * K)
    mv = memoryview(bytearray(4 * K)).cast("f")
    dist.all_to_all_single(mv, array.array("f", bytes(4 * K)))
    mv.release()
    got["released"] = (len(ba), mv.__repr__().startswith("<released"))
    return got


@pytest.mark.timeout(120)
def test_ndist_tensors_and_dlpack_arrays_run_in_one_c_call_with_the_python_engines_results():
    native, python = (run_ranks(_other_arrays, 2, timeout=100, env=env) for env in ENGINES)
    for rank in range(2):
        got, ref = native[rank], python[rank]
        assert got.pop("kind") == "FastLane" and ref.pop("kind") == "PlainLane", (got, ref)
        for kind in ("ndist.Tensor", "dlpack") + BUFFERS:
            for op, (result, one, _) in got[kind].items():
                assert one, (rank, kind, op)  # the C lane ran it
                assert result == ref[kind][op][0], (rank, kind, op, result, ref[kind][op][0])
                assert not ref[kind][op][1]  # (the Python engine has no C lane)
                # the Python engine's Python lane (PlainLane) takes what the C lane reads, but DLPack
                assert ref[kind][op][2] == (kind != "dlpack"), (rank, kind, op, ref[kind][op])
        assert got["ndist.Tensor strided"] is False, got
        assert got["ndarray subclass"] == (True, ref["ndarray subclass"][1]), (got, ref)
        for case in ("read-only dlpack", "legacy dlpack", "other device", "strided dlpack"):
            assert got[case] == ref[case], (case, got[case], ref[case])
        assert "expected a writable tensor" in got["read-only dlpack"], got
        assert "expected a writable tensor" in got["legacy dlpack"], got
        assert got["other device"][1] == 0, got  # a non-CPU producer is never asked to export by the lane
        assert got["strided dlpack"] == (None, [2.0] * K), got  # (staged by the Python path)
        assert got["freed"] == (True, True), got
        for case in ("read-only memoryview", "bytes input", "unknown format", "big-endian", "strided memoryview"):
            assert got[case] == ref[case], (case, got[case], ref[case])
        assert "tensor: expected a writable tensor, got a read-only memoryview of shape (4,)" in \
            got["read-only memoryview"], got
        assert got["bytes input"] is None, got  # read-only is fine for an input
        assert "got format 'c' (memoryview)" in got["unknown format"], got
        assert "got format '>f' (memoryview, big-endian)" in got["big-endian"], got
        assert got["strided memoryview"] == (None, [2.0, 1.0] * K), got  # staged, written back in place
        assert got["released"] == (2 * K, True), got


# ------------------------------------------------------------------ torch tensors
def _torch_tensors(rank, size):
    import torch

    import ndist.distributed as dist

    # torch tensors from the first call on (no NumPy call, no barrier): the general path's first
    # call makes the group's Python lane, its second the compiled one
    warm = torch.ones(8)
    dist.all_reduce(warm)
    dist.all_reduce(warm)
    got = {"plain": _every_op(dist, _wrapping(torch.from_numpy), rank, size)}

    got["parameter"] = _every_op(dist, _wrapping(lambda arr: torch.nn.Parameter(torch.from_numpy(arr))), rank, size)
    big = torch.arange(20, dtype=torch.float32)
    view = big[4:4 + 2 * K]  # storage offset 4, contiguous
    got["storage offset"] = (_one_c_call(lambda: dist.all_reduce(view)), _one_c_call(lambda: dist.all_reduce(view)),
                             big.tolist())
    ints = torch.full((K,), rank + 1, dtype=torch.int32)
    dist.all_reduce(ints, op=dist.ReduceOp.MAX)
    got["int32 max"] = (_one_c_call(lambda: dist.all_reduce(ints, op=dist.ReduceOp.MAX)), ints.tolist())
    # what the lane does not take: the Python path's behaviour and errors
    strided = torch.ones(2 * K)[::2]
    got["strided"] = (_one_c_call(lambda: dist.all_reduce(strided)), strided.tolist())
    empty = torch.empty(0)
    got["empty"] = (_one_c_call(lambda: dist.all_reduce(empty)), empty.tolist())
    got["negative"] = _error(lambda: dist.all_reduce(torch.ones(K)._neg_view()))
    got["meta"] = _error(lambda: dist.all_reduce(torch.empty(K, device="meta")))
    got["conjugate"] = _error(lambda: dist.all_reduce(torch.ones(K, dtype=torch.complex64).conj()))
    scalar = torch.tensor(float(rank + 1))  # 0-d
    dist.all_reduce(scalar)
    got["0-d"] = (_one_c_call(lambda: dist.all_reduce(scalar)), scalar.item())
    # torch's DLPack exchange table (``Tensor.__dlpack_c_exchange_api__``) is what the lane reads a
    # torch tensor through: a torch without one, or with another object there, goes to the Python lane
    table, ones = torch.Tensor.__dlpack_c_exchange_api__, torch.ones(K)
    try:
        del torch.Tensor.__dlpack_c_exchange_api__
        gone = _one_c_call(lambda: dist.all_reduce(ones))
        torch.Tensor.__dlpack_c_exchange_api__ = None
        other = _one_c_call(lambda: dist.all_reduce(ones))
    finally:
        torch.Tensor.__dlpack_c_exchange_api__ = table
    got["exchange table"] = (gone, other, _one_c_call(lambda: dist.all_reduce(ones)), ones.tolist())

    def tensor():
        t = torch.ones(K)
        return t, t

    got["freed"] = _gone(_freed_after(dist, tensor))
    return got


@pytest.mark.torch
@pytest.mark.timeout(150)
def test_torch_tensors_run_in_one_c_call_with_the_python_engines_results():
    pytest.importorskip("torch")
    native, python = (run_ranks(_torch_tensors, 2, timeout=130, env=env) for env in ENGINES)
    for rank in range(2):
        got, ref = native[rank], python[rank]
        for kind in ("plain", "parameter"):
            for op, (result, one, _) in got[kind].items():
                assert one, (rank, kind, op)
                assert result == ref[kind][op][0], (rank, kind, op, result, ref[kind][op][0])
        assert got["storage offset"][:2] == (True, True), got
        assert got["storage offset"][2] == ref["storage offset"][2], (got, ref)
        assert got["int32 max"] == (True, [2] * K) and ref["int32 max"][1] == [2] * K, (got, ref)
        assert got["strided"] == (False, [2.0] * K) and ref["strided"][1] == [2.0] * K, (got, ref)
        assert got["empty"] == (False, []), got
        for case in ("negative", "meta", "conjugate"):
            assert got[case] is not None and got[case] == ref[case], (case, got[case], ref[case])
        assert got["0-d"] == (True, 3.0 * 2) and ref["0-d"][1] == 3.0 * 2, (got, ref)
        assert got["exchange table"] == (False, False, True, [8.0] * K), got
        assert ref["exchange table"][3] == [8.0] * K, ref
        assert got["freed"] is True, got
