"""What one call through backend "ndist" returns: a Work learns its state from ndist's
when asked, with or without its future."""

import pytest

torch = pytest.importorskip("torch")

from torch_helpers import run_torch  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]


def _work_states(rank, n):
    import time

    import torch
    import torch.distributed as dist

    out = {}
    t = torch.full((1000,), float(rank + 1))
    work = dist.all_reduce(t, async_op=True)
    deadline = time.monotonic() + 30
    while not work.is_completed():  # no future asked: the state comes from ndist's Work
        assert time.monotonic() < deadline, "is_completed() never became True"
        time.sleep(0.001)
    out["polled"] = (work.is_success(), work.exception(), t[0].item())
    fut = work.get_future()  # asked after completion: settled at once
    out["late_future"] = (fut is work.get_future(), fut.wait()[0] is t, work.wait())

    # a blocking call on the group itself: torch's public functions drop this Work
    pg = dist.distributed_c10d._get_default_group()
    opts = dist.distributed_c10d.AllreduceOptions()
    opts.asyncOp = False
    u = torch.ones(4)
    done = pg.allreduce([u], opts)
    out["blocking"] = (done.is_completed(), done.is_success(), done.exception(), done.wait(),
                       done.get_future().wait()[0] is u, u.tolist(), done.result()[0] is u)
    return out


def test_a_work_reports_its_state_with_or_without_its_future(tmp_path):
    for out in run_torch(_work_states, 2, "ndist", tmp_path):
        assert out["polled"] == (True, None, 3.0), out
        assert out["late_future"] == (True, True, True), out
        assert out["blocking"] == (True, True, None, True, True, [2.0] * 4, True), out
