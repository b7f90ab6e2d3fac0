"""The scenarios of torch's own distributed suite that it runs only when the backend is
*named* gloo or nccl (tests/torch_suite/torch_suite.py runs the rest on "ndist"), here on
backend "ndist" and compared with Gloo: all_reduce_coalesced with every reduce op on the
world, a subgroup and a full new group (torch's test_all_reduce_coalesced_*), a Work's
future chained with ``then`` (test_get_future), batch_isend_irecv with tags
(test_batch_isend_irecv_gloo_tags) and a barrier that times out (test_barrier_timeout_*).

Covered elsewhere: scatter_object_list (test_torch_ops.py), DDP's no_sync and comm hooks
(the DDP tests); monitored_barrier, which torch refuses on every backend but Gloo by name
(``ValueError: monitored_barrier is only implemented for GLOO backend``), runs on ndist's
own API in tests/collectives/test_monitored_barrier.py.
"""

import re

import pytest

torch = pytest.importorskip("torch")

from tests.torch_backend.torch_helpers import run_torch, run_torch_and_gloo  # noqa: E402

pytestmark = pytest.mark.torch


def _gated(rank, n):
    import torch
    import torch.distributed as dist

    out = {}

    def val(*shape, k=0):
        return torch.arange(int(torch.tensor(shape).prod()), dtype=torch.float64).reshape(shape) + 10 * rank + k

    sub = dist.new_group([1, 2])  # (every rank creates every group, as torch requires)
    full = dist.new_group(list(range(n)))
    for gname, group in (("world", None), ("sub", sub), ("full", full)):
        if gname == "sub" and rank not in (1, 2):
            continue
        for op in ("SUM", "PRODUCT", "MIN", "MAX"):
            # different shapes in one call (torch wants one dtype): a mixed-up list shows
            ts = [val(3) % 5 + 1, val(2, 2) % 3 + 1, val(4) % 4]
            dist.all_reduce_coalesced(ts, op=getattr(dist.ReduceOp, op), group=group)
            out[f"all_reduce_coalesced/{gname}/{op}"] = ts

    # a Work's future, then two callbacks (torch's test_get_future)
    fut = dist.group.WORLD.allreduce([val(3, 2)]).get_future()
    out["get_future"] = fut.then(lambda f: [t * 3 for t in f.wait()]).then(lambda f: [t + 1 for t in f.wait()]).wait()

    # batch_isend_irecv with tags: every rank sends to every other, tag = sender * 10 + receiver
    ops, recvd = [], {}
    for peer in range(n):
        if peer == rank:
            continue
        recvd[peer] = torch.zeros(3, dtype=torch.float64)
        ops.append(dist.P2POp(dist.irecv, recvd[peer], peer, tag=peer * 10 + rank))
        ops.append(dist.P2POp(dist.isend, val(3, k=peer), peer, tag=rank * 10 + peer))
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    out["batch_isend_irecv/tags"] = [recvd[p] for p in sorted(recvd)]
    dist.barrier()
    return out


def _equal(a, b, key):
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), (key, a, b)
    else:
        assert len(a) == len(b), (key, a, b)
        for x, y in zip(a, b):
            _equal(x, y, key)


@pytest.mark.timeout(300)
def test_gated_scenarios_match_gloo(tmp_path):
    ours, gloo = run_torch_and_gloo(_gated, 3, tmp_path, timeout=280)
    for rank in range(3):
        assert ours[rank].keys() == gloo[rank].keys()
        for key in ours[rank]:
            _equal(ours[rank][key], gloo[rank][key], f"rank {rank}: {key}")
    # against the definition too, so that a mistake both share cannot pass
    x = [(torch.arange(3, dtype=torch.float64) + 10 * r) % 5 + 1 for r in range(3)]
    assert torch.equal(ours[0]["all_reduce_coalesced/world/PRODUCT"][0], x[0] * x[1] * x[2])
    assert torch.equal(ours[1]["all_reduce_coalesced/sub/MAX"][0], torch.maximum(x[1], x[2]))
    assert ours[0]["get_future"][0].tolist() == [[(3 * (2 * j + i) + 30) * 3 + 1 for i in range(2)] for j in range(3)]
    assert ours[2]["batch_isend_irecv/tags"][0].tolist() == [2.0, 3.0, 4.0]  # from rank 0, k = 2


def _barrier_timeout(rank, n, seconds):
    import time
    from datetime import timedelta

    import torch.distributed as dist

    full = dist.new_group(list(range(n)), timeout=timedelta(seconds=seconds))
    sub = dist.new_group([1, 2], timeout=timedelta(seconds=seconds))
    res = {}
    # only each group's first rank enters its barrier (rank 0 the full group's, rank 1 the
    # subgroup's, at the same time): it must time out
    for name, group, first in (("full", full, 0), ("sub", sub, 1)):
        if rank == first:
            t0 = time.monotonic()
            try:
                dist.barrier(group=group)
                res[name] = None
            except Exception as exc:  # noqa: BLE001 - what torch raises is the point
                res[name] = (type(exc).__name__, str(exc), time.monotonic() - t0)
            break
    # every rank waits here, groups alive, until both have timed out (torch's test waits likewise)
    time.sleep(seconds + 2)
    return res


@pytest.mark.timeout(240)
def test_a_barrier_only_one_rank_enters_times_out_after_the_groups_timeout(tmp_path):
    seconds = 2
    res = run_torch(_barrier_timeout, 3, "ndist", tmp_path, args=(seconds,), timeout=200)
    for rank, name in ((0, "full"), (1, "sub")):
        kind, msg, took = res[rank][name]
        # torch's test wants an Exception matching " (Timed out|closed|timeout) " (Gloo's
        # wording); ndist's is its DistTimeoutError, as torch's DistBackendError
        assert kind == "DistBackendError" and msg.startswith("DistTimeoutError: "), (kind, msg)
        assert re.search(r"timed out|did not complete within", msg), msg
        assert took >= seconds - 0.1, took
        assert took < seconds + 30, took
    assert "sub" not in res[0] and "full" not in res[1] and res[2] == {}
