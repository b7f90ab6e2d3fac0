"""torch 2.13's single-tensor names and the coalesced collectives.

``all_gather_single`` / ``reduce_scatter_single`` are 2.13's names for
``all_gather_into_tensor`` / ``reduce_scatter_tensor`` (same arguments, same
behaviour; both names stay, neither warns). ``all_reduce_coalesced`` and
``all_gather_coalesced`` run one public collective per tensor, in order, after
checking every tensor first (so a bad one raises before any byte is sent).
As in torch, with ``async_op=True`` they return a ``Future`` (not a Work)
whose value is the output tensors.
"""

from __future__ import annotations

from typing import Any

from ..runtime import resolve_group
from ..runtime._future import Future, collect_all
from . import _check
from ._api import all_gather, all_gather_into_tensor, all_reduce, reduce_scatter_tensor
from ._reduce_op import ReduceOp

__all__ = ["all_gather_single", "reduce_scatter_single", "all_reduce_coalesced", "all_gather_coalesced"]


def all_gather_single(output_tensor, input_tensor, group=None, async_op=False):
    """``output_tensor`` = every rank's ``input_tensor`` concatenated (or stacked) in rank
    order: torch 2.13's name for ``all_gather_into_tensor``."""
    return all_gather_into_tensor(output_tensor, input_tensor, group, async_op)


def reduce_scatter_single(output, input, op=ReduceOp.SUM, group=None, async_op=False):
    """``input`` holds group-size equal chunks; rank i's ``output`` = reduction of chunk i:
    torch 2.13's name for ``reduce_scatter_tensor``."""
    return reduce_scatter_tensor(output, input, op, group, async_op)


def _list(objs: Any, name: str) -> list:
    if isinstance(objs, (list, tuple)):
        return list(objs)
    raise TypeError(f"{name}: expected a list of tensors, got {type(objs).__name__}")


def _joined(works: list, outputs: list) -> Future:
    """One Future for the ``works``: its value is ``outputs``; it fails with the first error."""
    return collect_all([w.get_future() for w in works]).then(lambda fut: (fut.value(), outputs)[1])


def _finish(pg, works: list, outputs: list, async_op: bool):
    if async_op:
        return _joined(works, outputs)
    for w in works:  # in order, each within the group timeout (CUDA works: stream-ordered)
        w.wait() if getattr(w, "stream_ordered", False) else w.wait(pg.timeout)
    return None


def all_reduce_coalesced(tensors, op=ReduceOp.SUM, group=None, async_op=False):
    """``all_reduce`` each of ``tensors`` (one tensor or a list of one dtype), in place."""
    items = [tensors] if not isinstance(tensors, (list, tuple)) else list(tensors)
    if not items:
        raise ValueError("tensors: expected at least one tensor, got an empty list")
    arrays = [_check.output(t, f"tensors[{i}]") for i, t in enumerate(items)]
    _check.same_dtype([(f"tensors[{i}]", a) for i, a in enumerate(arrays)])
    _check.reduce_op(op, arrays[0].dtype)
    _check.check_bool("async_op", async_op)
    pg = resolve_group(group)
    if not pg.is_member:  # whatever the public collectives do for a non-member group
        return all_reduce(items[0], op, group, async_op)
    works = [all_reduce(t, op, group, async_op=True) for t in items]
    return _finish(pg, works, items, async_op)


def all_gather_coalesced(output_tensor_lists, input_tensor_list, group=None, async_op=False):
    """``output_tensor_lists[r][j]`` receives rank r's ``input_tensor_list[j]``."""
    ins = _list(input_tensor_list, "input_tensor_list")
    if not ins:
        raise ValueError("input_tensor_list: expected at least one tensor, got an empty list")
    in_arrays = [_check.tensor(t, f"input_tensor_list[{j}]") for j, t in enumerate(ins)]
    _check.same_dtype([(f"input_tensor_list[{j}]", a) for j, a in enumerate(in_arrays)])
    _check.check_bool("async_op", async_op)
    outs = _list(output_tensor_lists, "output_tensor_lists")
    pg = resolve_group(group)
    if not pg.is_member:
        return all_gather([], ins[0], group, async_op)
    if len(outs) != pg.size():
        raise ValueError(f"output_tensor_lists: expected {pg.size()} lists (the group size), got {len(outs)}")
    for r, row in enumerate(outs):
        row = _list(row, f"output_tensor_lists[{r}]")
        if len(row) != len(ins):
            raise ValueError(f"output_tensor_lists[{r}]: expected {len(ins)} tensors (one per input), "
                             f"got {len(row)}")
        for j, t in enumerate(row):
            arr = _check.output(t, f"output_tensor_lists[{r}][{j}]")
            if arr.dtype != in_arrays[j].dtype:
                raise TypeError(f"output_tensor_lists[{r}][{j}]: expected dtype {in_arrays[j].dtype} "
                                f"(that of input_tensor_list[{j}]), got {arr.dtype}")
            if r == pg.rank() and arr.size != in_arrays[j].size:
                raise ValueError(f"output_tensor_lists[{r}][{j}]: expected {in_arrays[j].size} elements "
                                 f"(those of input_tensor_list[{j}], this rank's), got {arr.size}")
    works = [all_gather([outs[r][j] for r in range(pg.size())], t, group, async_op=True)
             for j, t in enumerate(ins)]
    return _finish(pg, works, [list(row) for row in outs], async_op)
