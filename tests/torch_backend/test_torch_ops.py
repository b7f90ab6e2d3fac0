"""Every op torch.distributed sends to a backend, through torch's public API on
backend "ndist", against the same calls on Gloo (3 ranks: uneven splits, a
root that is not rank 0, a subgroup)."""

import pytest

torch = pytest.importorskip("torch")

from tests.torch_backend.torch_helpers import run_torch, run_torch_and_gloo  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]


def _ops(rank, n):  # noqa: PLR0915 - one program, every op
    import warnings

    import torch
    import torch.distributed as dist

    warnings.simplefilter("ignore", FutureWarning)  # torch's renames (all_gather_into_tensor ...)
    out = {}

    def val(*shape, dtype=torch.float32, k=0):
        t = torch.arange(int(torch.tensor(shape).prod()), dtype=torch.float64).reshape(shape)
        return (t + 10 * rank + k).to(dtype)

    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.float16, torch.uint8):
        for name in ("SUM", "MAX", "MIN", "PRODUCT"):
            t = val(5, dtype=dtype) % 7 if dtype == torch.uint8 else val(5, dtype=dtype)
            dist.all_reduce(t, op=getattr(dist.ReduceOp, name))
            out[f"all_reduce/{dtype}/{name}"] = t
    for name in ("SUM", "MAX", "MIN"):  # small integers: exact in bfloat16 whatever the order
        t = val(5, dtype=torch.bfloat16)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, name))
        out[f"all_reduce/bfloat16/{name}"] = t
    for dtype in (torch.int32, torch.bool):
        for name in ("BAND", "BOR", "BXOR"):
            t = (val(6) % 3 == 0) if dtype == torch.bool else val(6, dtype=dtype)
            dist.all_reduce(t, op=getattr(dist.ReduceOp, name))
            out[f"all_reduce/{dtype}/{name}"] = t
    c = torch.complex(val(4), -val(4, k=1))
    dist.all_reduce(c)
    out["all_reduce/complex64"] = c
    t = val(3, 4)[:, 1:3]  # non-contiguous
    dist.all_reduce(t)
    out["all_reduce/non_contiguous"] = t
    t = val(1000)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    assert work.wait() is True
    out["all_reduce/async_future"] = fut.wait()[0]
    ts = [val(3), val(2, 2), val(7)]
    dist.all_reduce_coalesced(ts)
    out["all_reduce_coalesced"] = ts
    ts = [val(3), val(4, k=1)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    out["coalescing_manager/all_reduce"] = ts

    t = val(6)
    dist.broadcast(t, src=1)
    out["broadcast"] = t
    t = torch.complex(val(3), val(3))
    dist.broadcast(t, src=2)
    out["broadcast/complex64"] = t
    t = val(4)
    dist.reduce(t, dst=1)
    out["reduce"] = t if rank == 1 else None

    outs = [torch.zeros(3) for _ in range(n)]
    dist.all_gather(outs, val(3))
    out["all_gather"] = outs
    outs = [torch.zeros(2, dtype=torch.complex128) for _ in range(n)]
    dist.all_gather(outs, torch.complex(val(2, dtype=torch.float64), val(2, dtype=torch.float64)))
    out["all_gather/complex128"] = outs
    o = torch.zeros(n * 4)
    dist.all_gather_into_tensor(o, val(4))
    out["all_gather_into_tensor"] = o
    o = torch.zeros(n * 2, 3)
    dist.all_gather_into_tensor(o, val(2, 3))
    out["all_gather_into_tensor/2d"] = o
    os_, is_ = [torch.zeros(n * 2), torch.zeros(n * 3)], [val(2), val(3, k=5)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(os_, is_):
            dist.all_gather_into_tensor(o, i)
    cm.wait()
    out["all_gather_into_tensor_coalesced"] = os_

    o = torch.zeros(3)
    dist.reduce_scatter(o, [val(3, k=j) for j in range(n)])
    out["reduce_scatter"] = o
    o = torch.zeros(2)
    dist.reduce_scatter_tensor(o, val(2 * n), op=dist.ReduceOp.MAX)
    out["reduce_scatter_tensor"] = o

    o = torch.zeros(2 * n)
    dist.all_to_all_single(o, val(2 * n))
    out["all_to_all_single/even"] = o
    # uneven: rank r sends (j + r + 1) rows of 2 to rank j
    in_splits = [j + rank + 1 for j in range(n)]
    out_splits = [rank + j + 1 for j in range(n)]
    i = val(sum(in_splits), 2)
    o = torch.full((sum(out_splits), 2), -1.0)
    dist.all_to_all_single(o, i, out_splits, in_splits)
    out["all_to_all_single/uneven"] = o
    i = torch.complex(val(sum(in_splits)), -val(sum(in_splits)))
    o = torch.zeros(sum(out_splits), dtype=torch.complex64)
    dist.all_to_all_single(o, i, out_splits, in_splits)
    out["all_to_all_single/uneven_complex64"] = o
    outs = [torch.zeros(2) for _ in range(n)]
    dist.all_to_all(outs, [val(2, k=j) for j in range(n)])
    out["all_to_all"] = outs

    gl = [torch.zeros(3) for _ in range(n)] if rank == 2 else None
    dist.gather(val(3), gather_list=gl, dst=2)
    out["gather"] = gl
    o = torch.zeros(4)
    dist.scatter(o, scatter_list=[val(4, k=j) for j in range(n)] if rank == 1 else None, src=1)
    out["scatter"] = o
    dist.barrier()
    dist.barrier(async_op=True).wait()

    # point to point: a ring, blocking and not, then any source
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    buf = torch.zeros(5)
    if rank % 2 == 0:
        dist.send(val(5), nxt)
        dist.recv(buf, prv)
    else:
        dist.recv(buf, prv)
        dist.send(val(5), nxt)
    out["send_recv"] = buf
    buf = torch.zeros(5, dtype=torch.complex64)
    reqs = [dist.isend(torch.complex(val(5), val(5)), nxt, tag=3), dist.irecv(buf, prv, tag=3)]
    for r in reqs:
        r.wait()
    out["isend_irecv/complex64"] = buf
    buf = torch.zeros(2)
    ops = [dist.P2POp(dist.isend, val(2), nxt), dist.P2POp(dist.irecv, buf, prv)]
    for r in dist.batch_isend_irecv(ops):
        r.wait()
    out["batch_isend_irecv"] = buf
    if rank == 0:
        got = []
        for _ in range(n - 1):
            b = torch.zeros(1)
            src = dist.recv(b)  # any source
            got.append((src, b.item()))
        out["recv_any_source"] = sorted(got)
    else:
        dist.send(torch.tensor([float(rank * 100)]), 0)
        out["recv_any_source"] = None

    objs = [None] * n
    dist.all_gather_object(objs, {"rank": rank, "s": "x" * rank})
    out["all_gather_object"] = objs
    lst = [rank, {"a": rank}] if rank == 1 else [None, None]
    dist.broadcast_object_list(lst, src=1)
    out["broadcast_object_list"] = lst
    gl = [None] * n if rank == 0 else None
    dist.gather_object(("g", rank), gl, dst=0)
    out["gather_object"] = gl
    so = [None]
    dist.scatter_object_list(so, [("s", j) for j in range(n)] if rank == 2 else None, src=2)
    out["scatter_object_list"] = so
    if rank == 0:
        dist.send_object_list([{"hello": 1}], dst=1)
        out["send_object_list"] = None
    elif rank == 1:
        lst = [None]
        dist.recv_object_list(lst, src=0)
        out["send_object_list"] = lst

    sub = dist.new_group([0, 2])
    if rank in (0, 2):
        t = val(3)
        dist.all_reduce(t, group=sub)
        out["subgroup/all_reduce"] = t
        t = val(2)
        dist.broadcast(t, src=2, group=sub)
        out["subgroup/broadcast"] = t
    dist.barrier()
    return out


def _equal(a, b, key):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), key
        assert a.dtype == b.dtype and a.shape == b.shape, (key, a, b)
        assert torch.equal(a, b), (key, a, b)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), (key, a, b)
        for x, y in zip(a, b):
            _equal(x, y, key)
    else:
        assert a == b, (key, a, b)


# Gloo (torch 2.13) leaves the last row of a non-contiguous all_reduce unreduced;
# checked against the definition instead.
_GLOO_WRONG = {"all_reduce/non_contiguous"}


def test_every_op_matches_gloo(tmp_path):
    ours, gloo = run_torch_and_gloo(_ops, 3, tmp_path, timeout=240)
    for rank in range(3):
        assert ours[rank].keys() == gloo[rank].keys()
        for key in ours[rank]:
            if key in _GLOO_WRONG:
                continue
            _equal(ours[rank][key], gloo[rank][key], f"rank {rank}: {key}")
    # spot checks against the definition (so a shared mistake cannot pass)
    assert ours[0]["all_reduce/torch.float32/SUM"].tolist() == [30.0 + 3 * i for i in range(5)]
    for rank in range(3):
        assert ours[rank]["all_reduce/non_contiguous"].tolist() == [[33.0, 36.0], [45.0, 48.0], [57.0, 60.0]]
    assert ours[0]["recv_any_source"] == [(1, 100.0), (2, 200.0)]
    assert ours[1]["all_to_all_single/uneven"][:, 0].tolist()[:2] == [2.0, 4.0]  # rank 0 rows 1-2


def _functional(rank, n):
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc

    g = dist.group.WORLD
    t = torch.arange(2 * n, dtype=torch.float32) + 10 * rank
    c = torch.complex(t, -t)
    out = {
        "all_reduce": fc.all_reduce(t, "sum", g),
        "all_reduce/max": fc.all_reduce(t, "max", g),
        "all_gather_tensor": fc.all_gather_tensor(t, 0, g),
        "reduce_scatter_tensor": fc.reduce_scatter_tensor(t, "sum", 0, g),
        "all_to_all_single": fc.all_to_all_single(t, None, None, g),
        "all_to_all_single/uneven": fc.all_to_all_single(
            torch.arange(rank + 1 + rank + 2, dtype=torch.float32) + 10 * rank,
            [rank + 1 + j for j in range(n)], [rank + 1 + j for j in range(n)], g) if n == 2 else None,
        "broadcast": fc.broadcast(t, 1, g),
        "all_reduce_coalesced": fc.all_reduce_coalesced([t, t * 2], "sum", g),
        "all_gather_into_tensor_coalesced": fc.all_gather_into_tensor_coalesced([t, t + 1], g),
        "reduce_scatter_tensor_coalesced": fc.reduce_scatter_tensor_coalesced([t, t * 3], "sum", [0, 0], g),
        "all_gather_tensor/complex64": fc.all_gather_tensor(c, 0, g),
    }

    def done(x):  # functional collectives return AsyncCollectiveTensors: wait (wait_tensor) first
        if isinstance(x, (list, tuple)):
            return [done(y) for y in x]
        return None if x is None else fc.wait_tensor(x).clone()

    return {k: done(v) for k, v in out.items()}


@pytest.mark.every_torch_release  # (torch finds the group by its name: how, changes by release)
def test_functional_collectives_match_gloo(tmp_path):
    ours = run_torch(_functional, 2, "ndist", tmp_path)  # (jobs of their own: funcol finds groups by name)
    gloo = run_torch(_functional, 2, "gloo", tmp_path)
    for rank in range(2):
        for key in ours[rank]:
            _equal(ours[rank][key], gloo[rank][key], f"rank {rank}: {key}")
    assert ours[0]["all_reduce"].tolist() == [10.0, 12.0, 14.0, 16.0]


def _beyond_gloo(rank, n):
    import torch
    import torch.distributed as dist

    avg = torch.tensor([1.0, 2.0]) * (rank + 1)
    dist.all_reduce(avg, op=dist.ReduceOp.AVG)
    pre = torch.tensor([1.0, 2.0]) * (rank + 1)
    dist.all_reduce(pre, op=dist._make_nccl_premul_sum(0.5))
    c = torch.complex(torch.ones(2), torch.ones(2)) * (rank + 1)
    dist.all_reduce(torch.view_as_real(c), op=dist.ReduceOp.AVG)
    outs = [torch.zeros(r + 1) for r in range(n)]  # a different size per rank
    dist.all_gather(outs, torch.full((rank + 1,), float(rank)))
    return avg.tolist(), pre.tolist(), c.tolist(), [o.tolist() for o in outs]


def test_ops_gloo_does_not_have_follow_their_definition(tmp_path):
    for avg, pre, c, outs in run_torch(_beyond_gloo, 2, "ndist", tmp_path):
        assert avg == [1.5, 3.0]
        assert pre == [1.5, 3.0]  # 0.5 * (1 + 2), 0.5 * (2 + 4)
        assert c == [1.5 + 1.5j, 1.5 + 1.5j]
        assert outs == [[0.0], [1.0, 1.0]]


def _integer_avg(rank, n):
    import torch
    import torch.distributed as dist

    mine = torch.tensor([3, -3, 100, -100], dtype=torch.int64) + rank  # rank 1: [4, -2, 101, -99]
    blocking = mine.clone()
    dist.all_reduce(blocking, op=dist.ReduceOp.AVG)
    queued = mine.clone()
    dist.all_reduce(queued, op=dist.ReduceOp.AVG, async_op=True).wait()
    wraps = torch.tensor([100, -100], dtype=torch.int8)
    dist.all_reduce(wraps, op=dist.ReduceOp.AVG)
    out = torch.zeros(2, dtype=torch.int32)
    dist.reduce_scatter_tensor(out, mine.to(torch.int32), op=dist.ReduceOp.AVG)
    try:
        dist.all_reduce(torch.ones(2, dtype=torch.bool), op=dist.ReduceOp.AVG)
        refused = None
    except ValueError as err:
        refused = str(err)
    after = torch.tensor([rank], dtype=torch.int64)
    dist.all_reduce(after)  # the group is usable after the refused call
    return blocking.tolist(), queued.tolist(), wraps.tolist(), out.tolist(), refused, after.item()


def test_integer_avg_is_the_sum_divided_toward_zero_as_on_nccl(tmp_path):
    # Lightning syncs an int64 batch size with AVG on every backend but "gloo" (test_lightning.py)
    results = run_torch(_integer_avg, 2, "ndist", tmp_path)
    for rank, (blocking, queued, wraps, out, refused, after) in enumerate(results):
        # sums 7, -5, 201, -199: halves truncated toward zero (floor would give -3, -100)
        assert blocking == queued == [3, -2, 100, -99]
        assert wraps == [-28, 28]  # int8: 200 wraps to -56, -200 to 56, as SUM does; then halved
        assert out == [[3, -2], [100, -99]][rank]
        assert "AVG needs an integer, floating-point or complex tensor, got dtype bool" in refused
        assert after == 1
