"""What one call through backend "ndist" costs and returns: a blocking call views each
tensor with ``Tensor.numpy()`` and makes no lock, future or callback, and no Work at all
for torch's own public functions; a Work learns its state from ndist's when asked;
tensors numpy() cannot view are refused by name; what numpy() does to a storage."""

import pytest

torch = pytest.importorskip("torch")

from tests.torch_backend.torch_helpers import run_torch  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]


@pytest.fixture(autouse=True)
def _python_backend(monkeypatch):
    """These are the Python backend's (``ProcessGroupNdist``) own costs and Works: its ranks
    run it, not the compiled backend (docs/torch.md, "The compiled backend")."""
    monkeypatch.setenv("NDIST_TORCH_COMPILED", "0")


def _blocking_calls(rank, n):
    import sys
    import warnings

    import torch
    import torch.distributed as dist

    warnings.simplefilter("ignore", FutureWarning)
    t, o = torch.ones(64), torch.empty(64 * n)
    ops = {
        "all_reduce": lambda: dist.all_reduce(t),
        "all_to_all_single": lambda: dist.all_to_all_single(o[:64], t),
        "all_gather_single": lambda: dist.all_gather_single(o, t),
        "reduce_scatter_single": lambda: dist.reduce_scatter_single(t, o),
        "broadcast": lambda: dist.broadcast(t, src=0),
    }
    seen = {}
    for name, call in ops.items():
        call()  # warm: first-call set-up is not what is counted
        calls = set()

        def prof(frame, event, arg, calls=calls):
            if event == "call":
                calls.add(frame.f_code.co_name)
            elif event == "c_call" and "ndist/torch" in frame.f_code.co_filename.replace("\\", "/"):
                calls.add(getattr(arg, "__qualname__", getattr(arg, "__name__", "?")))

        sys.setprofile(prof)
        try:
            call()
        finally:
            sys.setprofile(None)
        seen[name] = sorted(calls)
    return seen


def test_a_blocking_call_views_tensors_with_numpy_and_makes_no_future_or_lock(tmp_path):
    (seen,) = run_torch(_blocking_calls, 1, "ndist", tmp_path)
    for op, calls in seen.items():
        assert "Tensor.numpy" in calls, (op, calls)
        # ndist's general conversion (detach, module checks) is not on this path
        assert "_from_torch" not in calls and "as_array" not in calls, (op, calls)
        # no Work for torch's public function (it would only wait on it): no lock,
        # no future, no callback, no wait
        assert "allocate_lock" not in calls and "get_future" not in calls, (op, calls)
        assert "done_work" not in calls and "wait" not in calls, (op, calls)
        assert "add_done_callback" not in calls and "_one_done" not in calls, (op, calls)
    # the root reaches ndist as a global rank, the form of its short path for a repeated call
    assert "root_rank" not in seen["broadcast"], seen["broadcast"]


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


def _refused(rank, n):
    import torch
    import torch.distributed as dist

    errors = []
    for t in (torch.ones(4, device="meta"), torch.ones(4).to_sparse()):
        try:
            dist.all_reduce(t)
        except (ValueError, RuntimeError) as err:
            errors.append(str(err))
    t = torch.ones(3, requires_grad=True)  # not viewable by numpy(): still zero-copy (detached)
    with torch.no_grad():
        dist.all_reduce(t)
    b = torch.ones(3, dtype=torch.bfloat16)
    dist.all_reduce(b)
    return errors, t.tolist(), b.tolist()


def test_tensors_numpy_cannot_view_are_refused_by_name_or_converted(tmp_path):
    for errors, t, b in run_torch(_refused, 2, "ndist", tmp_path):
        assert len(errors) == 2, errors
        assert "tensors[0]: expected a CPU tensor" in errors[0] and "meta" in errors[0], errors
        assert "tensors[0]: expected a dense (strided) tensor" in errors[1], errors
        assert t == [2.0] * 3 and b == [2.0] * 3


def _blocking_works(rank, n):
    import weakref

    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import AllreduceOptions

    pg = dist.distributed_c10d._get_default_group()
    out = {}

    # a group that reaches this one's method with no Python frame between (as a torch
    # group of its own would, through C++) gets a Work, not None (a null Work in C++)
    import functools
    import sys

    class Through:
        pass

    through = Through()
    through.allreduce = functools.partial(pg.allreduce)
    returned = []

    def prof(frame, event, arg):
        if event == "return" and frame.f_code.co_name == "allreduce" and "ndist" in frame.f_code.co_filename:
            returned.append(type(arg).__name__)

    c = torch.ones(4)
    sys.setprofile(prof)
    try:
        dist.all_reduce(c, group=through)
        dist.all_reduce(c)
    finally:
        sys.setprofile(None)
    out["through"] = (returned, c.tolist())

    # torch's public functions get no Work from a blocking call (they would only wait on
    # it; test_a_blocking_call_views_tensors_with_numpy_and_makes_no_future_or_lock sees
    # that none is made or waited on), and nothing keeps their tensors afterwards
    big, o = torch.ones(1 << 16), torch.empty(4 * n)
    freed = weakref.ref(big)
    dist.all_reduce(big)
    dist.broadcast(big, 0)
    dist.all_gather_into_tensor(o, big[:4])
    dist.reduce_scatter_tensor(big[:4], o)
    dist.all_to_all_single(o, o.clone())
    dist.all_to_all_single(o, o.clone(), [4] * n, [4] * n)
    del big
    out["freed"] = freed() is None

    # a direct call gets a complete Work with its outputs, a new one each time
    opts = AllreduceOptions()
    opts.asyncOp = False
    a, b = torch.ones(4), torch.ones(4) * 2
    kept = pg.allreduce([a], opts)
    again = pg.allreduce([b], opts)
    out["direct"] = (again is not kept, kept.result()[0] is a, kept.get_future().wait()[0] is a,
                     again.result()[0] is b, again.is_completed(), again.wait(), repr(kept))

    # while coalescing, a blocking call joins the coalesced Work
    d = torch.ones(4) * 3
    pg.start_coalescing(torch.device("cpu"))
    inside = pg.allreduce([d], opts)
    coalesced = pg.end_coalescing(torch.device("cpu"))
    out["coalescing"] = (inside._works[0] in coalesced._works, coalesced.wait(), d.tolist())
    dist.all_reduce(d)  # and afterwards blocking calls are blocking again
    out["after_coalescing"] = d.tolist()
    return out


def test_torchs_public_functions_get_no_work_from_a_blocking_call(tmp_path):
    for out in run_torch(_blocking_works, 2, "ndist", tmp_path):
        assert out["through"] == (["NdistWork", "NoneType"], [4.0] * 4), out
        assert out["freed"] is True, out
        assert out["direct"] == (True, True, True, True, True, True, "<NdistWork allreduce ok>"), out
        assert out["coalescing"] == (True, True, [6.0] * 4), out
        assert out["after_coalescing"] == [12.0] * 4, out


def _storage_after_a_call(rank, n):
    import torch
    import torch.distributed as dist

    t = torch.ones(8)
    dist.all_reduce(t)
    try:  # Tensor.numpy() marked the storage not resizable (docs/torch.md)
        t.resize_(16)
        grown = "resized"
    except RuntimeError as err:
        grown = str(err)
    t.resize_(4)  # within the storage: every call views the tensor as it is now
    t.fill_(1.0)
    dist.all_reduce(t)
    shrunk = t.tolist()
    t.set_(torch.full((6,), 2.0))  # another storage
    dist.all_reduce(t)
    fresh = torch.ones(8)
    fresh.resize_(16)  # a tensor no op has seen stays resizable
    return grown, shrunk, t.tolist(), tuple(fresh.shape)


def test_a_tensor_an_op_has_seen_keeps_its_storage_size(tmp_path):
    for grown, shrunk, set_, fresh in run_torch(_storage_after_a_call, 2, "ndist", tmp_path):
        assert "not resizable" in grown, grown
        assert shrunk == [2.0] * 4 and set_ == [4.0] * 6 and fresh == (16,)


def test_only_torch_functions_that_test_the_work_for_none_get_none(monkeypatch):
    """``_waits`` admits a torch public function only if it calls the method, ``wait``,
    and its source tests the Work for None first (torch 2.13's do): one that waits on
    whatever it gets would fail on None, so its calls keep their Work."""
    import torch.distributed as tdist

    from ndist.torch import _group

    assert sorted(_group._waits()) == ["all_gather_single", "all_to_all_single", "allreduce", "broadcast",
                                       "reduce_scatter_single"]

    def all_reduce(tensor, op=None, group=None, async_op=False):  # waits whatever it gets
        work = group.allreduce([tensor], op)
        if async_op:
            return work
        work.wait()

    monkeypatch.setattr(tdist.distributed_c10d, "all_reduce", all_reduce)
    assert "allreduce" not in _group._waits() and "broadcast" in _group._waits()
