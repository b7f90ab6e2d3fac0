"""``torch.distributed.shrink_group`` on backend "ndist": docs/torch.md's recipe (DDP, a rank
SIGKILLs itself mid-training, the survivors catch the error, shrink the default group, re-wrap
DDP and finish with equal weights), run as the page shows under ndistrun --on-failure continue,
and under torchrun (which has no way to keep survivors: a long --monitor-interval lets them
finish before its agent looks, then it reports the lost rank)."""

import os
import re
import shutil
import signal
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from ndist.testing import run_ranks  # noqa: E402
from tests.torch_backend.torch_helpers import clean_env, run_command, torchrun_tmp  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(240)]

PAGE = Path(__file__).resolve().parents[2] / "docs" / "torch.md"


def _section() -> str:
    text = PAGE.read_text()
    start = text.index("## Carrying on without a lost rank")
    return text[start:text.index("\n## ", start + 1)]  # (to the next section, whichever it is)


def _script(tmp_path) -> Path:
    (body,) = re.findall(r"^```python\n(.*?)^```", _section(), re.S | re.M)
    assert "dist.shrink_group(" in body and "DDP(model)" in body
    path = tmp_path / "train.py"
    path.write_text(body)
    return path


def _run(argv, cwd, timeout=200, env=None):
    return run_command(argv, clean_env(**(env or {}), TMPDIR=torchrun_tmp(cwd)), cwd=cwd, timeout=timeout)


def _finished(out: str) -> list[str]:
    return sorted(re.findall(r"rank \d+ of \d+: \d+ steps, weights equal (?:True|False)", out))


def test_recipe_under_ndistrun_continue_prints_what_the_page_shows(tmp_path, request):
    """As the page shows: rank 0 lost at step 2 (whose weights DDP broadcast: the new rank 0 is
    old rank 1), store on ndistrun's agent (ndist://), on the compiled backend (the default):
    torch registers a shrunk group's C++ backend as GLOO, and DDP's logger then took ours for
    ProcessGroupGloo (every survivor died of SIGSEGV in DDP())."""
    request.getfixturevalue("torch_compiled_build")
    _script(tmp_path)
    (shown,) = re.findall(r"^```\n(\$ ndistrun.*?)^```", _section(), re.S | re.M)
    command, *expected = shown.strip().splitlines()
    argv = command[2:].split()
    assert argv[:4] == ["ndistrun", "--nproc-per-node", "4", "--on-failure"] and argv[4] == "continue"
    rc, out, err = _run([sys.executable, "-m", "ndist.launch", *argv[1:]], tmp_path,
                        env={"NDIST_TORCH_COMPILED": "1"})
    assert rc == 0, (out + err)[-4000:]
    assert _finished(out) == sorted(expected), (out + err)[-4000:]
    assert re.search(r"rank 0 .*killed by SIGKILL", err), err[-3000:]


def test_recipe_under_ndistrun_survives_losing_rank_0_on_the_python_backend(tmp_path):
    """The page's run (above: rank 0 lost, whose weights DDP broadcast; the new rank 0 is old
    rank 1) on the Python backend, which the test above does not run."""
    script = _script(tmp_path)
    rc, out, err = _run([sys.executable, "-m", "ndist.launch", "--nproc-per-node", "4", "--on-failure", "continue",
                         str(script), "2", "0", "ndist://"], tmp_path, env={"NDIST_TORCH_COMPILED": "0"})
    assert rc == 0, (out + err)[-4000:]
    assert _finished(out) == [f"rank {r} of 3: 8 steps, weights equal True" for r in (1, 2, 3)], (out + err)[-4000:]


def test_recipe_under_torchrun(tmp_path):
    """torchrun's agent hosts the store (env://); its --monitor-interval outlasts the job, so
    the survivors finish; then torchrun reports the lost rank and exits 1 (no option keeps
    survivors)."""
    script = _script(tmp_path)
    rc, out, err = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                         "--monitor-interval", "20", str(script), "3", "1"], tmp_path)
    assert _finished(out) == [f"rank {r} of 3: 8 steps, weights equal True" for r in (0, 2, 3)], (out + err)[-4000:]
    assert rc == 1, (out + err)[-4000:]
    assert re.search(r"local_rank\s*:\s*1\b", err) and "SIGKILL" in err, err[-3000:]


def _semantics(rank, size):
    """4 ranks on backend "ndist" (``ndist://``: the test hosts the store), global rank 3 dies;
    what each survivor sees, by check (``name -> value``, as text)."""
    from datetime import timedelta

    import torch.distributed as dist

    import ndist.torch
    from ndist.runtime import DistRankFailureError
    from tests.kill_sync import all_past

    said = {}
    torch.set_num_threads(1)
    dist.init_process_group("ndist", init_method="ndist://", timeout=timedelta(seconds=60))
    me = dist.get_rank()
    said["backend"] = type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__  # compiled or Python
    sub = dist.new_group([1, 2, 3])  # rank 3 is rank 2 of sub
    dist.barrier()
    all_past(dist.distributed_c10d._get_default_store(), me, 4, victim=3)
    if me == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    t = torch.ones(2)
    try:
        dist.all_reduce(t)  # blocking: the lost member's error
    except dist.DistNetworkError as err:
        said["first"] = f"{type(err).__name__} cause={type(err.__cause__).__name__} mentions3={'rank 3' in str(err)}"
    try:
        dist.all_reduce(t)  # the group is revoked: the same error at once, with the ranks
    except dist.DistNetworkError as err:
        said["revoked"] = f"{type(err).__name__} {isinstance(err.__cause__, DistRankFailureError)} {err.failed_ranks}"
    said["failed"] = str(ndist.torch.get_failed_ranks())
    # a rank that is alive cannot be excluded: every caller gets ValueError, nothing changes
    try:
        dist.shrink_group([3] if me == 1 else [1, 3])
        said["alive"] = "shrunk"
    except ValueError:
        said["alive"] = f"ValueError {dist.get_world_size()}"
    if me in (1, 2):  # a group other than the default: ranks 1, 2 shrink sub without rank 3
        small = dist.shrink_group([2], group=sub)
        s = torch.tensor([float(me)])
        dist.all_reduce(s, group=small)
        said["sub"] = f"{small.rank()}/{small.size()} {dist.get_process_group_ranks(small)} sum={s.item():g}"
    new = dist.shrink_group([3], shrink_flags=dist.distributed_c10d.SHRINK_ABORT)  # the default group: the new default
    x = torch.tensor([float(me + 1)])
    dist.all_reduce(x)
    said["default"] = (f"{new is dist.group.WORLD} {dist.get_rank()}/{dist.get_world_size()} sum={x.item():g} "
                       f"backend={dist.get_backend()} {type(new._get_backend(torch.device('cpu'))).__name__}")
    objs = [None] * dist.get_world_size()
    dist.all_gather_object(objs, me)
    said["objects"] = str(objs)
    dist.destroy_process_group()
    said["done"] = str(me)
    return said


@pytest.mark.every_torch_release
@pytest.mark.parametrize("compiled", ["1", "0"], ids=["compiled", "python"])
def test_shrink_group_semantics_on_backend_ndist(compiled, request):
    """4 ranks (the test hosts the store), global rank 3 SIGKILLed: the blocking op raises
    torch's DistNetworkError naming it, then (revoked) with ndist's DistRankFailureError and
    failed_ranks; excluding a live rank is refused on every caller; a subgroup shrinks to the
    right global ranks; the default group shrinks (SHRINK_ABORT) to the new default. On the
    compiled backend (torch's own last step, over a clone of the ``ndist://`` store) and on the
    Python one (the group itself becomes the new group)."""
    if compiled == "1":
        request.getfixturevalue("torch_compiled_build")
    kind = "NdistBackend" if compiled == "1" else "ProcessGroupNdist"
    res = run_ranks(_semantics, 4, init=False, timeout=150, may_die=[3], env={"NDIST_TORCH_COMPILED": compiled})
    assert res[3] is None, res
    for rank in range(3):
        lines = res[rank]
        assert lines["backend"] == kind, lines
        # mid-op, a lost connection (DistNetworkError); once the group knows, DistRankFailureError
        assert lines["first"] in ("DistNetworkError cause=DistNetworkError mentions3=True",
                                  "DistNetworkError cause=DistRankFailureError mentions3=True"), lines
        assert lines["revoked"] == "DistNetworkError True [3]", lines
        assert lines["failed"] == "[3]", lines
        assert lines["alive"] == "ValueError 4", lines
        if rank in (1, 2):
            assert lines["sub"] == f"{rank - 1}/2 [1, 2] sum=3", lines
        assert lines["default"] == f"True {rank}/3 sum=6 backend=ndist {kind}", lines
        assert lines["objects"] == "[0, 1, 2]", lines
        assert lines["done"] == str(rank), lines


_MPI_JOB = """
import pathlib, sys
import torch.distributed as dist
import ndist.torch

dist.init_process_group("ndist", init_method="ndist://", pg_options=ndist.torch.Options(backend="mpi"))
try:  # refused on the caller, before any message: the peer does not take part
    dist.shrink_group([1 - dist.get_rank()])
except TypeError as err:
    # one file per rank: mpiexec merges the ranks' stdout, and two lines can interleave mid-line
    pathlib.Path(sys.argv[1], f"rank{dist.get_rank()}.txt").write_text(
        f"TypeError supports_shrinking={dist.group.WORLD.supports_shrinking}")
dist.barrier()  # the group is still whole
dist.destroy_process_group()
"""


@pytest.mark.skipif(shutil.which("mpiexec", path=os.path.dirname(sys.executable)) is None
                    and shutil.which("mpiexec") is None, reason="no mpiexec")
def test_the_mpi_backend_cannot_shrink(tmp_path):
    """torch raises TypeError, as for Gloo: the mpi backend would need MPI's ULFM."""
    pytest.importorskip("mpi4py")
    script = tmp_path / "job.py"
    script.write_text(_MPI_JOB)
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    rc, out, err = _run([mpiexec, "-n", "2", sys.executable, str(script), str(tmp_path)], tmp_path, timeout=120)
    assert rc == 0, (out + err)[-4000:]
    for r in (0, 1):
        said = tmp_path / f"rank{r}.txt"
        assert said.exists(), f"rank {r} did not get TypeError:\n" + (out + err)[-4000:]
        assert said.read_text() == "TypeError supports_shrinking=False"
