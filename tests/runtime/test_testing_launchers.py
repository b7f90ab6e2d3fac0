"""ndist.testing.run_ranks under a launcher: ndistrun, mpiexec, torchrun start the ranks as
they start a user's job, and run_ranks still returns every rank's result or names the
rank that failed."""

import os
import shutil
import sys
import time

import numpy as np
import pytest

from ndist.testing import RankFailedError, run_ranks

HAS_MPIEXEC = bool(shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec"))
#: a variable each launcher sets in its ranks' environment, and run_ranks' own spawn does not
SIGN = {"ndistrun": "NDIST_RESTART_COUNT", "mpiexec": "PMI_RANK", "torchrun": "TORCHELASTIC_RUN_ID"}


def _sum_and_launcher(rank, world_size, name):
    import ndist.distributed as dist

    x = np.array([rank + 1.0])
    dist.all_reduce(x)
    return rank, world_size, float(x[0]), dist.get_backend(), SIGN[name] in os.environ


@pytest.mark.timeout(90)
@pytest.mark.parametrize("launcher", ["ndistrun", pytest.param("mpiexec", marks=pytest.mark.skipif(
    not HAS_MPIEXEC, reason="mpiexec not installed"))])
def test_the_launcher_starts_every_rank_and_run_ranks_gets_their_results(launcher):
    backend = "mpi" if launcher == "mpiexec" else "socket"
    out = run_ranks(_sum_and_launcher, 3, args=(launcher,), backend=backend, launcher=launcher, timeout=60)
    assert out == [(r, 3, 6.0, backend, True) for r in range(3)]
    assert out.launcher_exitcode == 0


def _torch_sum(rank, world_size):
    import torch
    import torch.distributed as tdist

    x = torch.tensor([rank + 1.0])
    tdist.all_reduce(x)
    return rank, float(x[0]), tdist.get_backend(), SIGN["torchrun"] in os.environ


@pytest.mark.torch
@pytest.mark.timeout(150)
def test_under_torchrun_init_joins_torchs_process_group():
    pytest.importorskip("torch")
    out = run_ranks(_torch_sum, 2, backend="ndist", launcher="torchrun", timeout=120)
    assert out == [(r, 3.0, "ndist", True) for r in range(2)]


def _raise_on_rank_2(rank, world_size):
    if rank == 2:
        raise KeyError("rank two's own error")
    time.sleep(60)


@pytest.mark.timeout(90)
def test_a_rank_that_raises_under_ndistrun_is_named_with_its_traceback():
    t0 = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        run_ranks(_raise_on_rank_2, 3, init=False, launcher="ndistrun", timeout=60)
    assert info.value.rank == 2 and "KeyError" in str(info.value) and "_raise_on_rank_2" in info.value.traceback
    assert time.monotonic() - t0 < 45  # did not wait for the sleeping ranks


def _exit_on_rank_1(rank, world_size):
    if rank == 1:
        os._exit(7)
    time.sleep(60)


@pytest.mark.timeout(90)
def test_ranks_that_end_without_a_result_fail_the_run_once_the_launcher_exits():
    """ndistrun ends the job when rank 1 exits 7 (its default --on-failure): every rank
    that had not reported is named, and the launcher's exit."""
    with pytest.raises(RankFailedError) as info:
        run_ranks(_exit_on_rank_1, 3, init=False, launcher="ndistrun", timeout=60)
    assert "ended without reporting a result (their launcher exited with code" in str(info.value)
    assert "1" in str(info.value).split("ranks ", 1)[1].split("]", 1)[0]


def _victim_exits(rank, world_size):
    if rank == 1:
        os._exit(3)
    return rank


@pytest.mark.timeout(90)
def test_launcher_options_reach_the_launcher_and_may_die_holds_under_it():
    """With ndistrun's ``--on-failure continue`` the other ranks finish; rank 1 may die."""
    out = run_ranks(_victim_exits, 3, init=False, launcher="ndistrun", launcher_options=["--on-failure", "continue"],
                    may_die=[1], timeout=60)
    assert out == [0, None, 2]
    assert out.launcher_exitcode == 0  # (with --on-failure continue, the survivors' status)


@pytest.mark.parametrize("kw, error, words", [
    (dict(launcher="srun"), ValueError, ["launcher", "'ndistrun'", "'srun'"]),
    (dict(launcher_options="--on-failure"), TypeError, ["launcher_options", "sequence of str", "'--on-failure'"]),
    (dict(launcher_options=["--x"]), ValueError, ["launcher_options", "'spawn'", "['--x']"]),
])
def test_bad_launcher_arguments_are_refused_before_anything_starts(kw, error, words):
    with pytest.raises(error) as info:
        run_ranks(_victim_exits, 2, init=False, **kw)
    assert all(w in str(info.value) for w in words), str(info.value)
