"""The public collectives, with torch.distributed's signatures and semantics.

Each function checks every argument (``_check``) before anything is sent,
turns the tensors into contiguous arrays over the caller's memory
(``_convert``; non-contiguous outputs are staged and written back), maps
global ranks to group ranks, builds one ``Call`` record and hands it to the
backend method of the same name through ``_common.submit``. ``src`` / ``dst``
are global ranks; ``group_src`` / ``group_dst`` give the rank within
``group`` instead (torch 2.5+). On a group this process is not a member of,
every function does nothing and returns ``None``, as in torch.

Unlike torch's Gloo backend, the list forms (``all_gather``, ``gather``,
``scatter``, ``all_to_all``, ``reduce_scatter``) accept tensors of different
sizes per rank.
"""

from __future__ import annotations

from ..runtime import resolve_group
from ..runtime import world as _world  # its ``default`` group: group=None in one attribute load
from . import _check
from ._backend import Call, Op
from ._common import backend_of, member_group, submit
from ._convert import contiguous_input, contiguous_output, device_type, unaliased
from ._plain import PlainLane
from ._reduce_op import ReduceOp

__all__ = [
    "all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "gather", "scatter",
    "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "barrier",
]


def _flat(arr):
    """``arr`` as 1-D (itself when it already is: reshape costs a view per call)."""
    return arr if arr.ndim == 1 else arr.reshape(-1)


def _rows_to_elements(splits: list[int], shape) -> list[int]:
    row = 1
    for d in shape[1:]:
        row *= d
    return splits if row == 1 else [s * row for s in splits]


# ------------------------------------------------------------- repeated call
# One body per op, with one fast exit (docs/architecture.md, "One call, by hand"): with
# ``async_op=False`` on a group that has a fast lane (``ProcessGroup.fast``: ``_plain.PlainLane``,
# or the native engine's ``_cnative.FastLane`` in its place), the function asks it first; it
# runs the common case and answers True, or answers False and the general path below checks
# everything in its own order and raises its own errors. The lane is made by the group's first
# checked CPU collective (``_submit``).


def _submit(pg, method, call: Call, async_op, post=None, outputs=None):
    """``submit``, then the group's fast lane once its CPU lane exists (and its compiled lane
    once the backend offers it)."""
    r = submit(pg, method, call, async_op, post, outputs)
    fast = pg.fast
    if fast is None:
        lane = pg.lanes.get("cpu")
        if lane is not None:
            pg.fast = PlainLane(lane)
    elif type(fast) is PlainLane and fast.pending:  # (the compiled lane may take what this one does not)
        fast.upgrade()
    return r


# ------------------------------------------------------------------ reductions


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce ``tensor`` over every rank of ``group``, in place on every rank."""
    if async_op is False:
        pg = _world.default if group is None else resolve_group(group)
        if pg is not None:
            fast = pg.fast
            if fast is not None and fast.all_reduce(tensor, op):
                return None
    pg = member_group(group, "all_reduce")
    if pg is None:
        return None
    arr = _check.output(tensor, "tensor")
    rop, scale = _check.reduce_op(op, arr.dtype)
    if async_op is not False:
        _check.check_bool("async_op", async_op)
    post: list = []
    buf = contiguous_output(arr, post)
    dev = device_type(arr)
    call = Call(Op.ALL_REDUCE, dev, buf.dtype, out=buf, redop=rop, scale=scale)
    return _submit(pg, backend_of(pg, call).all_reduce, call, async_op, post, [tensor])


def reduce(tensor, dst=None, op=ReduceOp.SUM, group=None, async_op=False, group_dst=None):
    """Reduce ``tensor`` over ``group`` into ``dst``'s ``tensor``; other ranks' tensors are unchanged."""
    pg = member_group(group, "reduce")
    if pg is None:
        return None
    root = _check.root_rank(pg, "dst", dst, "group_dst", group_dst)
    arr = _check.output(tensor, "tensor")
    rop, scale = _check.reduce_op(op, arr.dtype)
    if async_op is not False:
        _check.check_bool("async_op", async_op)
    post: list = []
    buf = contiguous_output(arr, post) if pg.rank() == root else contiguous_input(arr)
    dev = device_type(arr)
    call = Call(Op.REDUCE, dev, buf.dtype, out=buf, root=root, redop=rop, scale=scale)
    return _submit(pg, backend_of(pg, call).reduce, call, async_op, post, [tensor])


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False):
    """``output`` on rank i = reduction over ranks of their ``input_list[i]``."""
    pg = member_group(group, "reduce_scatter")
    if pg is None:
        return None
    out = _check.output(output, "output")
    ins = _check.tensor_list(input_list, "input_list", pg.size())
    dev = _check.common([out] + ins, lambda i: f"input_list[{i - 1}]" if i else "output")
    mine = ins[pg.rank()]
    if mine.size != out.size:
        raise ValueError(f"input_list[{pg.rank()}]: expected {out.size} elements (those of output), "
                         f"got {mine.size}")
    rop, scale = _check.reduce_op(op, out.dtype)
    if async_op is not False:
        _check.check_bool("async_op", async_op)
    post: list = []
    buf = contiguous_output(out, post)
    inputs = unaliased([_flat(contiguous_input(a)) for a in ins], [buf])
    call = Call(Op.REDUCE_SCATTER, dev, buf.dtype, out=_flat(buf), inputs=inputs, redop=rop, scale=scale)
    return _submit(pg, backend_of(pg, call).reduce_scatter, call, async_op, post, [output])


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False):
    """``input`` holds ``group.size()`` equal chunks; rank i's ``output`` = reduction of chunk i."""
    if async_op is False:
        pg = _world.default if group is None else resolve_group(group)
        if pg is not None:
            fast = pg.fast
            if fast is not None and fast.reduce_scatter_from(output, input, op):
                return None
    pg = member_group(group, "reduce_scatter_tensor")
    if pg is None:
        return None
    out = _check.output(output, "output")
    inp = _check.tensor(input, "input")
    dev = _check.common((out, inp), ("output", "input").__getitem__)
    if inp.size != out.size * pg.size():
        raise ValueError(f"input: expected {out.size * pg.size()} elements (output's {out.size} x group size "
                         f"{pg.size()}), got {inp.size}")
    rop, scale = _check.reduce_op(op, out.dtype)
    if async_op is not False:
        _check.check_bool("async_op", async_op)
    post: list = []
    buf = contiguous_output(out, post)
    (src,) = unaliased([contiguous_input(inp)], [buf])
    call = Call(Op.REDUCE_SCATTER_FROM, dev, buf.dtype, out=_flat(buf), inp=_flat(src), redop=rop, scale=scale)
    return _submit(pg, backend_of(pg, call).reduce_scatter_from, call, async_op, post, [output])


# --------------------------------------------------------------- data movement


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    """Copy ``src``'s ``tensor`` into every rank's ``tensor``."""
    if async_op is False:
        pg = _world.default if group is None else resolve_group(group)
        if pg is not None:
            fast = pg.fast
            if fast is not None and fast.broadcast(tensor, src, group_src):
                return None
    pg = member_group(group, "broadcast")
    if pg is None:
        return None
    root = _check.root_rank(pg, "src", src, "group_src", group_src)
    arr = _check.output(tensor, "tensor") if pg.rank() != root else _check.tensor(tensor, "tensor")
    if async_op is not False:
        _check.check_bool("async_op", async_op)
    post: list = []
    buf = contiguous_output(arr, post) if pg.rank() != root else contiguous_input(arr)
    dev = device_type(arr)
    call = Call(Op.BROADCAST, dev, buf.dtype, out=buf, root=root)
    return _submit(pg, backend_of(pg, call).broadcast, call, async_op, post, [tensor])


def all_gather(tensor_list, tensor, group=None, async_op=False):
    """``tensor_list[i]`` receives rank i's ``tensor`` (sizes may differ per rank)."""
    pg = member_group(group, "all_gather")
    if pg is None:
        return None
    inp = _check.tensor(tensor, "tensor")
    outs = _check.tensor_list(tensor_list, "tensor_list", pg.size(), out=True)
    dev = _check.common([inp] + outs, lambda i: f"tensor_list[{i - 1}]" if i else "tensor")
    if outs[pg.rank()].size != inp.size:
        raise ValueError(f"tensor_list[{pg.rank()}]: expected {inp.size} elements (those of tensor, this "
                         f"rank's contribution), got {outs[pg.rank()].size}")
    if async_op is not False:
        _check.check_bool("async_op", async_op)
    post: list = []
    bufs = [_flat(contiguous_output(a, post)) for a in outs]
    (src,) = unaliased([_flat(contiguous_input(inp))], bufs)
    call = Call(Op.ALL_GATHER, dev, src.dtype, inp=src, outputs=bufs)
    return _submit(pg, backend_of(pg, call).all_gather, call, async_op, post, list(tensor_list))


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    """``output_tensor`` = every rank's ``input_tensor`` concatenated (or stacked) in rank order."""
    if async_op is False:
        pg = _world.default if group is None else resolve_group(group)
        if pg is not None:
            fast = pg.fast
            if fast is not None and fast.all_gather_into(output_tensor, input_tensor):
                return None
    pg = member_group(group, "all_gather_into_tensor")
    if pg is None:
        return None
    out = _check.output(output_tensor, "output_tensor")
    inp = _check.tensor(input_tensor, "input_tensor")
    dev = _check.common((out, inp), ("output_tensor", "input_tensor").__getitem__)
    if out.size != inp.size * pg.size():
        raise ValueError(f"output_tensor: expected {inp.size * pg.size()} elements (input_tensor's {inp.size} "
                         f"x group size {pg.size()}), got {out.size}")
    if async_op is not False:
        _check.check_bool("async_op", async_op)
    post: list = []
    buf = contiguous_output(out, post)
    (src,) = unaliased([_flat(contiguous_input(inp))], [buf])
    call = Call(Op.ALL_GATHER_INTO, dev, src.dtype, out=_flat(buf), inp=src)
    return _submit(pg, backend_of(pg, call).all_gather_into, call, async_op, post, [output_tensor])


def _root_list(pg, root: int, objs, name: str, out: bool):
    if pg.rank() == root:
        if objs is None:
            raise ValueError(f"{name}: expected a list of {pg.size()} tensors on the root rank "
                             f"{pg.ranks[root]}, got None")
        return _check.tensor_list(objs, name, pg.size(), out=out)
    if objs is not None and (not hasattr(objs, "__len__") or len(objs) != 0):
        raise ValueError(f"{name}: expected None or [] on non-root rank {pg.ranks[pg.rank()]} "
                         f"(root is {pg.ranks[root]}), got {type(objs).__name__} of length "
                         f"{len(objs) if hasattr(objs, '__len__') else '?'}")
    return None


def gather(tensor, gather_list=None, dst=None, group=None, async_op=False, group_dst=None):
    """On ``dst``, ``gather_list[i]`` receives rank i's ``tensor`` (sizes may differ)."""
    pg = member_group(group, "gather")
    if pg is None:
        return None
    root = _check.root_rank(pg, "dst", dst, "group_dst", group_dst, default=0)
    inp = _check.tensor(tensor, "tensor")
    outs = _root_list(pg, root, gather_list, "gather_list", out=True)
    named = [("tensor", inp)] + [(f"gather_list[{i}]", a) for i, a in enumerate(outs or [])]
    _check.same_dtype(named)
    dev = _check.same_device(named)
    if outs is not None and outs[root].size != inp.size:
        raise ValueError(f"gather_list[{root}]: expected {inp.size} elements (those of tensor), "
                         f"got {outs[root].size}")
    if async_op is not False:
        _check.check_bool("async_op", async_op)
    post: list = []
    bufs = None if outs is None else [_flat(contiguous_output(a, post)) for a in outs]
    (src,) = unaliased([_flat(contiguous_input(inp))], bufs or [])
    call = Call(Op.GATHER, dev, src.dtype, inp=src, outputs=bufs, root=root)
    return _submit(pg, backend_of(pg, call).gather, call, async_op, post,
                  list(gather_list) if outs is not None else [])


def scatter(tensor, scatter_list=None, src=None, group=None, async_op=False, group_src=None):
    """Rank i's ``tensor`` receives ``src``'s ``scatter_list[i]`` (sizes may differ)."""
    pg = member_group(group, "scatter")
    if pg is None:
        return None
    root = _check.root_rank(pg, "src", src, "group_src", group_src, default=0)
    out = _check.output(tensor, "tensor")
    ins = _root_list(pg, root, scatter_list, "scatter_list", out=False)
    named = [("tensor", out)] + [(f"scatter_list[{i}]", a) for i, a in enumerate(ins or [])]
    _check.same_dtype(named)
    dev = _check.same_device(named)
    if ins is not None and ins[root].size != out.size:
        raise ValueError(f"scatter_list[{root}]: expected {out.size} elements (those of tensor), "
                         f"got {ins[root].size}")
    if async_op is not False:
        _check.check_bool("async_op", async_op)
    post: list = []
    buf = _flat(contiguous_output(out, post))
    inputs = None if ins is None else unaliased([_flat(contiguous_input(a)) for a in ins], [buf])
    call = Call(Op.SCATTER, dev, buf.dtype, out=buf, inputs=inputs, root=root)
    return _submit(pg, backend_of(pg, call).scatter, call, async_op, post, [tensor])


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
    """Rank i's ``input_tensor_list[j]`` lands in rank j's ``output_tensor_list[i]``."""
    pg = member_group(group, "all_to_all")
    if pg is None:
        return None
    outs = _check.tensor_list(output_tensor_list, "output_tensor_list", pg.size(), out=True)
    ins = _check.tensor_list(input_tensor_list, "input_tensor_list", pg.size())
    n = len(ins)
    dev = _check.common(ins + outs, lambda i: f"input_tensor_list[{i}]" if i < n else f"output_tensor_list[{i - n}]")
    me = pg.rank()
    if outs[me].size != ins[me].size:
        raise ValueError(f"output_tensor_list[{me}]: expected {ins[me].size} elements (those of "
                         f"input_tensor_list[{me}], which this rank sends itself), got {outs[me].size}")
    if async_op is not False:
        _check.check_bool("async_op", async_op)
    post: list = []
    bufs = [_flat(contiguous_output(a, post)) for a in outs]
    inputs = unaliased([_flat(contiguous_input(a)) for a in ins], bufs)
    call = Call(Op.ALL_TO_ALL, dev, ins[0].dtype, outputs=bufs, inputs=inputs)
    return _submit(pg, backend_of(pg, call).all_to_all, call, async_op, post, list(output_tensor_list))


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op=False):
    """Split ``input`` along dim 0 by ``input_split_sizes``, exchange, and concatenate into ``output``."""
    if async_op is False:
        pg = _world.default if group is None else resolve_group(group)
        if pg is not None:
            fast = pg.fast
            if fast is not None and fast.all_to_all_single(output, input, output_split_sizes, input_split_sizes):
                return None
    pg = member_group(group, "all_to_all_single")
    if pg is None:
        return None
    out = _check.output(output, "output")
    inp = _check.tensor(input, "input")
    dev = _check.common((out, inp), ("output", "input").__getitem__)
    oshape, ishape = out.shape, inp.shape
    if not oshape or not ishape:
        name = "output" if not oshape else "input"
        raise ValueError(f"{name}: expected a tensor with at least one dimension, got a 0-d tensor")
    if oshape != ishape and oshape[1:] != ishape[1:]:
        raise ValueError(f"output: expected trailing dimensions {tuple(ishape[1:])} (those of input), "
                         f"got shape {tuple(oshape)}")
    n = len(pg.ranks)
    # Even (no split sizes: torch's promise that every rank splits evenly): the record
    # carries no splits, and a backend may use its even primitive (MPI_Alltoall).
    even = (output_split_sizes is None and input_split_sizes is None and oshape == ishape
            and not oshape[0] % n)
    osz = isz = None
    if not even:
        osz = _check.split_sizes("output_split_sizes", output_split_sizes, out.shape[0], n, "output")
        isz = _check.split_sizes("input_split_sizes", input_split_sizes, inp.shape[0], n, "input")
        me = pg.rank()
        if osz[me] != isz[me]:
            raise ValueError(f"output_split_sizes[{me}]: expected {isz[me]} (input_split_sizes[{me}], what this "
                             f"rank sends itself), got {osz[me]}")
        osz, isz = _rows_to_elements(osz, oshape), _rows_to_elements(isz, ishape)
    if async_op is not False:
        _check.check_bool("async_op", async_op)
    post: list = []
    buf = contiguous_output(out, post)
    (src,) = unaliased([contiguous_input(inp)], [buf])
    call = Call(Op.ALL_TO_ALL_SINGLE, dev, src.dtype, out=_flat(buf), inp=_flat(src), out_splits=osz,
                in_splits=isz)
    return _submit(pg, backend_of(pg, call).all_to_all_single, call, async_op, post, [output])


# ----------------------------------------------------------------- barriers


def barrier(group=None, async_op=False, device_ids=None):
    """Block until every rank of ``group`` entered the barrier."""
    if async_op is False and device_ids is None:
        pg = _world.default if group is None else resolve_group(group)
        if pg is not None:
            fast = pg.fast
            if fast is not None and fast.barrier():
                return None
    pg = member_group(group, "barrier")
    if pg is None:
        return None
    if device_ids is not None and not isinstance(device_ids, (list, tuple)):
        raise TypeError(f"device_ids: expected a list of ints or None, got {type(device_ids).__name__}")
    if async_op is not False:
        _check.check_bool("async_op", async_op)
    device = "cuda" if device_ids else "cpu"
    call = Call(Op.BARRIER, device)
    return _submit(pg, backend_of(pg, call).barrier, call, async_op)
