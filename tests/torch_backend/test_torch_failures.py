"""Failures on backend "ndist" reach the torch program as exceptions naming the
peer: a rank SIGKILLed in the middle of DDP training, a bad argument."""

import time

import pytest

torch = pytest.importorskip("torch")

from tests.kill_sync import kill_self, killed_at  # noqa: E402
from tests.torch_backend.torch_helpers import run_torch, run_torch_with_victim  # noqa: E402

pytestmark = pytest.mark.torch

GROUP_TIMEOUT = 60


def _ddp_killed(rank, size, folder):
    """DDP training; the last rank dies in the middle of a backward pass of step 20 (while the
    reducer's all-reduces are in flight); a survivor returns what its step raised."""
    import threading

    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 8))
    ddp = DDP(model, bucket_cap_mb=0.1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randn(32, 8)
    for step in range(1000):
        if rank == size - 1 and step == 20:
            def die():
                time.sleep(0.002)
                kill_self(folder)

            threading.Thread(target=die, daemon=True).start()
        try:
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
        except Exception as err:
            return {"t": time.time(), "type": type(err).__name__, "msg": str(err), "step": step}
    return "no error in 1000 steps"


@pytest.mark.timeout(180)
def test_sigkilled_rank_mid_ddp_fails_survivors_naming_it(tmp_path):
    size = 3
    res = run_torch_with_victim(_ddp_killed, size, "ndist", tmp_path, size - 1, args=(str(tmp_path),),
                                timeout=GROUP_TIMEOUT + 60, group_timeout=GROUP_TIMEOUT)
    assert res[-1] is None, res
    killed = killed_at(tmp_path)
    for rank in range(size - 1):
        rec = res[rank]
        assert isinstance(rec, dict), (rank, rec)
        assert f"rank {size - 1}" in rec["msg"], rec
        assert rec["t"] - killed < GROUP_TIMEOUT, rec


def _bad_arguments(rank, n):
    import torch
    import torch.distributed as dist

    errors = []
    try:
        dist.all_to_all_single(torch.zeros(4), torch.zeros(4), [1, 1, 1], [2, 2])  # splits of the wrong length
    except (ValueError, RuntimeError) as err:
        errors.append(str(err))
    t = torch.ones(3)
    dist.all_reduce(t)  # the group is still usable
    return errors, t.tolist()


def test_bad_arguments_raise_before_sending_and_the_group_stays_usable(tmp_path):
    for errors, t in run_torch(_bad_arguments, 2, "ndist", tmp_path):
        assert len(errors) == 1 and "split" in errors[0], errors
        assert t == [2.0, 2.0, 2.0]


def _mismatched_ddp(rank, n):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = torch.nn.Linear(4, 3 if rank == 0 else 5)  # rank 1's parameters have other shapes
    try:
        DDP(model)
    except RuntimeError as err:
        return str(err)
    # rank 0's DDP init may complete: the root of its initial broadcast may return before the
    # receivers call (as with NCCL or MPI; ndist's native engine: docs/native.md); its next
    # collective then names the rank that left
    try:
        torch.distributed.barrier()
    except RuntimeError as err:
        return str(err)
    return None


def test_ddp_shape_verification_goes_through_the_backend_and_names_the_ranks(tmp_path):
    first, second = run_torch(_mismatched_ddp, 2, "ndist", tmp_path)
    # rank 1 compares its shapes with rank 0's (gathered through the backend) and raises
    assert "appears not to match" in second and "process 0" in second, second
    # rank 0, whose shapes match what it gathered, goes on to DDP's initial broadcast and
    # loses rank 1 there or at its next collective (or sees the mismatch too): either way an
    # error that names rank 1
    assert first is not None and ("rank 1" in first or "process 1" in first), first


def _lost_peer(rank, n):
    import torch
    import torch.distributed as dist

    dist.barrier()  # connects the pair
    if rank == 1:
        return None  # leaves: destroy_process_group closes its connections
    t = torch.ones(4)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    out = {}
    try:
        work.wait()
    except Exception as err:  # noqa: BLE001 - what torch code sees
        out["wait"] = (type(err).__name__, isinstance(err, dist.DistError), str(err))
    out["state"] = (work.is_completed(), work.is_success(), type(work.exception()).__name__)
    try:
        fut.wait()
    except Exception as err:  # noqa: BLE001
        out["future"] = (type(err).__name__, str(err))
    late = dist.all_reduce(torch.ones(2), async_op=True)
    try:
        late.wait()
    except Exception:  # noqa: BLE001 - settled as failed before its future is asked for
        pass
    try:
        late.get_future().wait()
    except Exception as err:  # noqa: BLE001
        out["late_future"] = (type(err).__name__, str(err))
    ok = torch.ones(2)
    try:
        dist.all_reduce(ok)  # a blocking call on the broken group: raised, not hung
    except Exception as err:  # noqa: BLE001
        out["blocking"] = (type(err).__name__, str(err))
    try:
        dist.all_to_all_single(torch.zeros(2), torch.ones(2))  # the same for an all_to_all_single
    except Exception as err:  # noqa: BLE001
        out["blocking_a2a"] = (isinstance(err, dist.DistError), str(err))
    return out


def test_a_lost_peer_fails_work_future_and_blocking_calls_as_torch_errors_naming_it(tmp_path):
    out, _ = run_torch(_lost_peer, 2, "ndist", tmp_path, group_timeout=30)
    name, is_dist_error, msg = out["wait"]
    assert name == "DistNetworkError" and is_dist_error and "rank 1" in msg, out
    assert out["state"] == (True, False, "DistNetworkError"), out
    assert out["future"][0] == "RuntimeError" and "rank 1" in out["future"][1], out
    assert out["late_future"][0] == "RuntimeError" and "rank 1" in out["late_future"][1], out
    assert "rank 1" in out["blocking"][1], out
    assert out["blocking_a2a"][0] and "rank 1" in out["blocking_a2a"][1], out


def _mismatch(rank, n):
    import torch
    import torch.distributed as dist

    dist.barrier()
    t = torch.ones(4 if rank == 0 else 8)  # the same op with different sizes
    try:
        dist.all_reduce(t)
    except Exception as err:  # noqa: BLE001 - what torch code sees
        return type(err).__name__, str(err)
    return None


def test_a_mismatched_collective_raises_on_every_rank_naming_the_other(tmp_path):
    results = run_torch(_mismatch, 2, "ndist", tmp_path, group_timeout=30)
    for rank, res in enumerate(results):
        assert res is not None, results
        name, msg = res
        assert name == "DistBackendError" and f"rank {1 - rank}" in msg, results
