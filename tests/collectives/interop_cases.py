"""Collectives on torch CPU tensors and DLPack producers: results land in the
caller's memory (zero-copy in, staged write-back for non-contiguous outputs)."""

from __future__ import annotations

import traceback

import numpy as np

CASES: list = []


def case(fn):
    CASES.append(fn)
    return fn


class DLPackOnly:
    """A producer that only speaks DLPack (of the array or tensor it wraps)."""

    def __init__(self, arr):
        self._arr = arr

    def __dlpack__(self, **kwargs):
        return self._arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._arr.__dlpack_device__()


@case
def torch_all_reduce_in_place(dist, torch, rank, size):
    for dtype in (torch.int64, torch.float32, torch.bfloat16, torch.complex64, torch.bool, torch.float16):
        t = torch.ones(4, dtype=dtype) * (rank + 1) if dtype != torch.bool else torch.tensor([rank == 0] * 4)
        ptr = t.data_ptr()
        dist.all_reduce(t)
        assert t.data_ptr() == ptr
        if dtype == torch.bool:
            assert t.tolist() == [True] * 4, (dtype, t)
        else:
            assert t.tolist() == [sum(range(1, size + 1))] * 4, (dtype, t)


@case
def torch_non_contiguous_output_written_back(dist, torch, rank, size):
    base = torch.zeros(3, 2 * size)
    out = base[:, ::2]  # a strided view: staged, then written back into base
    assert not out.is_contiguous()
    want = torch.arange(3 * size, dtype=torch.float32).reshape(3, size)
    dist.broadcast(want.clone() if rank == 0 else out, src=0)
    if rank != 0:
        assert base[:, ::2].tolist() == want.tolist()
        assert base[:, 1::2].abs().sum().item() == 0  # the neighbouring columns are untouched
    inp = torch.full((3,), float(rank))
    flat_out = torch.zeros(size * 3)
    dist.all_gather_into_tensor(flat_out, inp)
    assert flat_out.tolist() == [float(r) for r in range(size) for _ in range(3)]


@case
def torch_all_to_all_single_and_lists(dist, torch, rank, size):
    inp = torch.arange(2 * size) + 10 * rank
    out = torch.empty(2 * size, dtype=torch.int64)
    dist.all_to_all_single(out, inp)
    assert out.tolist() == [10 * r + 2 * rank + k for r in range(size) for k in range(2)]
    outs = [torch.empty(1, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(outs, torch.tensor([rank]))
    assert [o.item() for o in outs] == list(range(size))


@case
def irecv_into_strided_torch_tensor(dist, torch, rank, size):
    if size == 1:
        return
    if rank == 1:
        dist.send(torch.arange(3, dtype=torch.float32) + 1, dst=0, tag=21)
    elif rank == 0:
        base = torch.zeros(6)
        work = dist.irecv(base[::2], tag=21)  # any source, non-contiguous: staged + written back
        work.wait()
        assert work.result() == [1], work.result()
        assert base.tolist() == [1, 0, 2, 0, 3, 0]


@case
def dlpack_and_mixed_sources(dist, torch, rank, size):
    t = torch.full((2,), float(rank + 1), dtype=torch.float64)
    dist.all_reduce(DLPackOnly(t))
    assert t.tolist() == [float(sum(range(1, size + 1)))] * 2
    outs = [np.zeros(1) for _ in range(size)]
    dist.all_gather(outs, torch.tensor([float(rank)], dtype=torch.float64))  # torch in, numpy out
    assert [o[0] for o in outs] == list(range(size))


def run_cases(dist) -> dict:
    import torch

    rank, size = dist.get_rank(), dist.get_world_size()
    results = {}
    for fn in CASES:
        try:
            fn(dist, torch, rank, size)
            results[fn.__name__] = None
        except Exception:  # noqa: BLE001
            results[fn.__name__] = traceback.format_exc()
    return results


def entry(rank=None, world_size=None, device="cpu") -> dict:
    import ndist.distributed as dist

    return run_cases(dist)
