"""What torch 2.14 asks of backend "ndist" that 2.13 did not, run on whichever of the two
releases is installed (CI runs both): ``group._get_backend(cpu)`` answers the group itself
(2.14's ``batch_isend_irecv`` and ``shrink_group`` ask for it: without it,
``batch_isend_irecv`` raised ``No backend type associated with device type cpu``), and
``batch_isend_irecv`` runs through it on the default group and on a subgroup; 2.14's
``gather_single`` is refused as Gloo refuses it."""

import pytest

torch = pytest.importorskip("torch")

from tests.torch_backend.torch_helpers import run_torch  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.every_torch_release, pytest.mark.timeout(150)]


def _backend_and_batch(rank, n):
    import torch.distributed as dist

    import ndist.torch

    from ndist.torch._compiled import python_group

    out = {}
    world = dist.group.WORLD
    backend = world._get_backend(torch.device("cpu"))
    out["backend"] = (type(backend).__name__, backend is world, isinstance(backend, ndist.torch.ProcessGroupNdist),
                      python_group(world).ndist_group.ranks)
    try:
        world._get_backend(torch.device("cuda"))
        out["cuda"] = "no error"
    except RuntimeError as err:
        out["cuda"] = str(err)
    sub = dist.new_group([1, 2])
    if rank in (1, 2):
        out["sub_backend"] = python_group(sub).ndist_group.ranks
    # a ring on the default group, then a pair on the subgroup (group ranks)
    buf = torch.zeros(3)
    ops = [dist.P2POp(dist.isend, torch.full((3,), float(rank)), (rank + 1) % n),
           dist.P2POp(dist.irecv, buf, (rank - 1) % n)]
    works = dist.batch_isend_irecv(ops)
    for w in works:
        w.wait()
    out["ring"] = (buf.tolist(), len(works), all(w.is_completed() for w in works))
    if rank in (1, 2):
        peer = 1 - sub.rank()
        got = torch.zeros(2)
        ops = [dist.P2POp(dist.irecv, got, group=sub, group_peer=peer, tag=5),
               dist.P2POp(dist.isend, torch.full((2,), 10.0 * rank), group=sub, group_peer=peer, tag=5)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        out["sub"] = got.tolist()
    if hasattr(dist, "gather_single"):  # torch 2.14
        try:
            dist.gather_single(torch.ones(2), torch.zeros(2 * n) if rank == 0 else None, dst=0)
            out["gather_single"] = "no error"
        except RuntimeError as err:
            out["gather_single"] = str(err)
    return out


@pytest.mark.parametrize("compiled", ["1", "0"], ids=["compiled", "python"])
def test_get_backend_answers_the_group_and_batch_isend_irecv_runs_through_it(tmp_path, compiled, monkeypatch,
                                                                             request):
    """The Python backend answers ``_get_backend`` with the group itself; the compiled one's
    group (a C++ ProcessGroup) with its ``NdistBackend``, which says it coalesces (2.14's
    ``batch_isend_irecv`` then runs inside ``_coalescing_manager``: the Python group's)."""
    if compiled == "1":
        request.getfixturevalue("torch_compiled_build")
    monkeypatch.setenv("NDIST_TORCH_COMPILED", compiled)
    results = run_torch(_backend_and_batch, 3, "ndist", tmp_path)
    expected = ("NdistBackend", False, False) if compiled == "1" else ("ProcessGroupNdist", True, True)
    for rank, out in enumerate(results):
        assert out["backend"] == (*expected, (0, 1, 2)), out
        assert out["cuda"].startswith("No backend type associated with device type cuda"), out
        # (one Work where torch coalesces: 2.14 does for the compiled backend, which says it can)
        assert out["ring"] in [([float((rank - 1) % 3)] * 3, n, True) for n in ((1, 2) if compiled == "1" else (2,))], out
        if rank in (1, 2):
            assert out["sub_backend"] == (1, 2), out
            assert out["sub"] == [10.0 * (3 - rank)] * 2, out
        if "gather_single" in out and compiled == "1":  # (torch's Backend's own refusal)
            assert out["gather_single"].startswith("Backend ndist does not support gather_single"), out
        elif "gather_single" in out:
            assert out["gather_single"] == ("Backend ndist does not support gather_single (use dist.gather with a "
                                            "gather_list)"), out
