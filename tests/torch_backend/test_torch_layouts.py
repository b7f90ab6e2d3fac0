"""torch's argument layouts, method by method: every ``ProcessGroup`` method that takes
lists (or lists of lists) of tensors, called the way torch calls it, with values that
name their rank and input (``_val``) and shapes that differ per input, so that a
transposed layout ([input][rank] for [rank][input]) raises or puts a value in the
wrong place. Each case is checked against its definition, written out here, on
backend "ndist" and on Gloo (which confirms that the definition is torch's layout)."""

import pytest

torch = pytest.importorskip("torch")

from tests.torch_backend.torch_helpers import run_torch_and_gloo  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]


def _val(rank, i, shape, dtype=None):
    """Rank ``rank``'s input ``i``: 1000 * rank + 100 * i + its element index."""
    import torch

    t = torch.arange(int(torch.tensor(shape).prod()), dtype=torch.float64).reshape(shape) + 1000 * rank + 100 * i
    return t.to(dtype or torch.float32)


def _layouts(rank, n):  # noqa: PLR0915 - one program, every layout
    import warnings

    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import AllgatherOptions, _get_default_group

    warnings.simplefilter("ignore", FutureWarning)
    pg = _get_default_group()
    backend = dist.get_backend()
    shapes = [(2,), (3, 2), (1,)][: 5 - n]  # 3 inputs at 2 ranks, 2 at 3: never as many as ranks
    got = {}

    def check(name, run):
        try:
            got[name] = run()
        except Exception as exc:  # noqa: BLE001 - reported by name, compared below
            got[name] = f"{type(exc).__name__}: {exc}"

    def same(actual, expected):
        if isinstance(expected, list):
            if not isinstance(actual, list) or len(actual) != len(expected):
                return f"expected {len(expected)} items, got {actual!r}"
            for a, e in zip(actual, expected):
                bad = same(a, e)
                if bad is not True:
                    return bad
            return True
        if actual.shape != expected.shape or not torch.equal(actual, expected):
            return f"expected {expected.tolist()}, got {actual.tolist()}"
        return True

    # all_gather_coalesced: output_lists[rank][input] (torch's docstring and test suite)
    def all_gather_coalesced(async_op):
        outs = [[torch.full(s, -1.0) for s in shapes] for _ in range(n)]
        work = dist.all_gather_coalesced(outs, [_val(rank, i, s) for i, s in enumerate(shapes)], async_op=async_op)
        if async_op:
            work.wait()
        return same(outs, [[_val(r, i, s) for i, s in enumerate(shapes)] for r in range(n)])

    check("all_gather_coalesced", lambda: all_gather_coalesced(False))
    check("all_gather_coalesced/async", lambda: all_gather_coalesced(True))

    def allgather_coalesced_method():
        outs = [[torch.full(s, -1.0) for s in shapes] for _ in range(n)]
        pg.allgather_coalesced(outs, [_val(rank, i, s) for i, s in enumerate(shapes)],
                               AllgatherOptions()).wait()
        return same(outs, [[_val(r, i, s) for i, s in enumerate(shapes)] for r in range(n)])

    check("allgather_coalesced/method", allgather_coalesced_method)

    def allgather_coalesced_bad_layouts():  # raised before anything is sent; the group goes on below
        ins = [_val(rank, i, s) for i, s in enumerate(shapes)]
        errors = []
        for outs in ([[torch.zeros(s) for s in shapes] for _ in range(n + 1)],  # a list too many
                     [[torch.zeros(s) for s in shapes[:-1]] for _ in range(n)]):  # an input short
            try:
                pg.allgather_coalesced(outs, ins, AllgatherOptions())
            except ValueError as exc:
                errors.append(str(exc))
        return errors

    if backend == "ndist":
        got["allgather_coalesced/bad_layouts"] = allgather_coalesced_bad_layouts()

    # allgather: output_tensors[0][rank] (one list per device)
    def allgather_method():
        outs = [torch.full((3, 2), -1.0) for _ in range(n)]
        pg.allgather([outs], [_val(rank, 0, (3, 2))], AllgatherOptions()).wait()
        return same(outs, [_val(r, 0, (3, 2)) for r in range(n)])

    check("allgather/method", allgather_method)

    # all_gather_into_tensor: rank r's input at rows r (1-D and 2-D outputs)
    def all_gather_into_tensor():
        o1, o2 = torch.full((n * 4,), -1.0), torch.full((n * 2, 3), -1.0)
        dist.all_gather_into_tensor(o1, _val(rank, 0, (4,)))
        dist.all_gather_into_tensor(o2, _val(rank, 1, (2, 3)))
        return same([o1, o2], [torch.cat([_val(r, 0, (4,)) for r in range(n)]),
                               torch.cat([_val(r, 1, (2, 3)) for r in range(n)])])

    check("all_gather_into_tensor", all_gather_into_tensor)

    # allgather_into_tensor_coalesced: outputs[i] gathers inputs[i] (two sizes)
    sizes = [2, 5]

    def all_gather_into_tensor_coalesced(direct):
        outs = [torch.full((n * k,), -1.0) for k in sizes]
        ins = [_val(rank, i, (k,)) for i, k in enumerate(sizes)]
        if direct:
            pg.allgather_into_tensor_coalesced(outs, ins, AllgatherOptions()).wait()
        else:
            with dist._coalescing_manager(async_ops=True) as cm:
                for o, i in zip(outs, ins):
                    dist.all_gather_into_tensor(o, i)
            cm.wait()
        return same(outs, [torch.cat([_val(r, i, (k,)) for r in range(n)]) for i, k in enumerate(sizes)])

    check("allgather_into_tensor_coalesced/coalescing_manager", lambda: all_gather_into_tensor_coalesced(False))
    check("allgather_into_tensor_coalesced/method", lambda: all_gather_into_tensor_coalesced(True))

    # allreduce_coalesced: tensors[i] reduced with every rank's tensors[i]
    def all_reduce_coalesced(direct):
        ts = [_val(rank, i, s) for i, s in enumerate(shapes)]
        if direct:
            opts = dist.AllreduceCoalescedOptions()
            opts.reduceOp = dist.ReduceOp.SUM
            pg.allreduce_coalesced(ts, opts).wait()
        else:
            dist.all_reduce_coalesced(ts)
        return same(ts, [sum(_val(r, i, s) for r in range(n)) for i, s in enumerate(shapes)])

    check("allreduce_coalesced", lambda: all_reduce_coalesced(False))
    check("allreduce_coalesced/method", lambda: all_reduce_coalesced(True))

    # reduce_scatter: input_list[r] goes to rank r; input_tensors[0] is that list
    def reduce_scatter(direct):
        o = torch.full((3, 2), -1.0)
        ins = [_val(rank, j, (3, 2)) for j in range(n)]
        if direct:
            opts = dist.ReduceScatterOptions()
            opts.reduceOp = dist.ReduceOp.SUM
            pg.reduce_scatter([o], [ins], opts).wait()
        else:
            dist.reduce_scatter(o, ins)
        return same(o, sum(_val(q, rank, (3, 2)) for q in range(n)))

    check("reduce_scatter", lambda: reduce_scatter(False))
    check("reduce_scatter/method", lambda: reduce_scatter(True))

    def reduce_scatter_tensor():
        o = torch.full((2, 3), -1.0)
        dist.reduce_scatter_tensor(o, _val(rank, 0, (n * 2, 3)))
        return same(o, sum(_val(q, 0, (n * 2, 3)) for q in range(n))[2 * rank: 2 * rank + 2])

    check("reduce_scatter_tensor", reduce_scatter_tensor)

    # reduce_scatter_tensor_coalesced: outputs[i] gets its rows of inputs[i] (two sizes)
    def reduce_scatter_tensor_coalesced(direct):
        outs = [torch.full((k,), -1.0) for k in sizes]
        ins = [_val(rank, i, (n * k,)) for i, k in enumerate(sizes)]
        if direct:
            opts = dist.ReduceScatterOptions()
            opts.reduceOp = dist.ReduceOp.SUM
            pg.reduce_scatter_tensor_coalesced(outs, ins, opts).wait()
        else:
            with dist._coalescing_manager(async_ops=True) as cm:
                for o, i in zip(outs, ins):
                    dist.reduce_scatter_tensor(o, i)
            cm.wait()
        return same(outs, [sum(_val(q, i, (n * k,)) for q in range(n))[rank * k: rank * k + k]
                           for i, k in enumerate(sizes)])

    check("reduce_scatter_tensor_coalesced/coalescing_manager", lambda: reduce_scatter_tensor_coalesced(False))
    check("reduce_scatter_tensor_coalesced/method", lambda: reduce_scatter_tensor_coalesced(True))

    # alltoall: output_tensors[j] receives rank j's input_tensors[rank]
    def alltoall():
        outs = [torch.full((2, 2), -1.0) for _ in range(n)]
        dist.all_to_all(outs, [_val(rank, j, (2, 2)) for j in range(n)])
        return same(outs, [_val(j, rank, (2, 2)) for j in range(n)])

    check("alltoall", alltoall)

    # alltoall_base: output_split_sizes[j] rows come from rank j, input_split_sizes[j] rows go to it;
    # rank r sends (j + 2 * r + 1) rows to rank j, so the sizes differ both ways
    def alltoall_base(direct):
        in_splits = [j + 2 * rank + 1 for j in range(n)]
        out_splits = [rank + 2 * j + 1 for j in range(n)]
        inp = _val(rank, 0, (sum(in_splits), 2))
        o = torch.full((sum(out_splits), 2), -1.0)
        if direct:
            pg.alltoall_base(o, inp, out_splits, in_splits, dist.AllToAllOptions()).wait()
        else:
            dist.all_to_all_single(o, inp, out_splits, in_splits)
        expected = []
        for j in range(n):  # rank j's rows for this rank start after those it sends to ranks < rank
            start = sum(q + 2 * j + 1 for q in range(rank))
            expected.append(_val(j, 0, (sum(q + 2 * j + 1 for q in range(n)), 2))[start: start + rank + 2 * j + 1])
        return same(o, torch.cat(expected))

    check("alltoall_base", lambda: alltoall_base(False))
    check("alltoall_base/method", lambda: alltoall_base(True))

    # gather: output_tensors[0][r] on the root receives rank r's input
    def gather(direct):
        root = n - 1
        gl = [torch.full((2, 3), -1.0) for _ in range(n)] if rank == root else None
        if direct:
            opts = dist.GatherOptions()
            opts.rootRank = root
            pg.gather([gl] if rank == root else [], [_val(rank, 0, (2, 3))], opts).wait()
        else:
            dist.gather(_val(rank, 0, (2, 3)), gather_list=gl, dst=root)
        return same(gl, [_val(r, 0, (2, 3)) for r in range(n)]) if rank == root else True

    check("gather", lambda: gather(False))
    check("gather/method", lambda: gather(True))

    # scatter: input_tensors[0][r] on the root goes to rank r
    def scatter(direct):
        root = 1
        o = torch.full((3,), -1.0)
        sl = [_val(root, j, (3,)) for j in range(n)] if rank == root else None
        if direct:
            opts = dist.ScatterOptions()
            opts.rootRank = root
            pg.scatter([o], [sl] if rank == root else [], opts).wait()
        else:
            dist.scatter(o, scatter_list=sl, src=root)
        return same(o, _val(root, rank, (3,)))

    check("scatter", lambda: scatter(False))
    check("scatter/method", lambda: scatter(True))

    dist.barrier()
    return backend, got


# Gloo (torch 2.13) has no list all_to_all ("ProcessGroupGloo does not support alltoall").
_GLOO_LACKS = {"alltoall"}


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_list_layout_is_torchs(tmp_path, world_size):
    ours, gloo = run_torch_and_gloo(_layouts, world_size, tmp_path, timeout=240)
    for rank in range(world_size):
        backend, got = ours[rank]
        assert backend == "ndist"
        k = 5 - world_size
        assert got.pop("allgather_coalesced/bad_layouts") == [
            f"output_lists: expected {world_size} lists (one per rank), got {world_size + 1}",
            f"output_lists[0]: expected {k} tensors (one per input), got {k - 1}"]
        bad = {k: v for k, v in got.items() if v is not True}
        assert bad == {}, f"rank {rank} on ndist: {bad}"
        _, on_gloo = gloo[rank]
        bad = {k: v for k, v in on_gloo.items() if v is not True and k not in _GLOO_LACKS}
        assert bad == {}, f"rank {rank} on gloo (the definitions above are wrong): {bad}"
        assert on_gloo.keys() == got.keys()
