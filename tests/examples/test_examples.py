"""Every program in examples/ runs on several ranks, as a user would launch it, and checks itself."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.mpi_jobs import mpiexec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _run(cmd, timeout=120, env=None, stderr=False):
    env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + (proc.stderr if stderr else "")


def ndistrun(nproc, example, *args, launch=(), env=None, stderr=False):
    return _run([sys.executable, "-m", "ndist.launch", "--nproc-per-node", str(nproc), *launch,
                 str(EXAMPLES / example), *args], env=env, stderr=stderr)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("nproc", [2, 4])
def test_moe_dispatch_matches_single_process(nproc):
    out = ndistrun(nproc, "moe_dispatch.py")
    assert f"MoE layer: {nproc} ranks" in out
    assert "[rank0]:OK: matches the single-process computation" in out
    assert out.count("max |error|") == nproc


@pytest.mark.timeout(180)
def test_data_parallel_converges_to_single_process_weights():
    out = ndistrun(4, "data_parallel.py")
    assert "[rank0]:OK: converged, same weights as single-process training" in out


@pytest.mark.timeout(180)
def test_overlap_checks_every_bucket_of_both_schedules_and_reports_the_timing_as_measured():
    out = ndistrun(2, "overlap.py")
    assert "[rank0]:OK: both schedules give the same, correct sums in all 8 buckets on every rank" in out
    # The timing is reported, not judged: whichever way it went, the words match the numbers.
    sync = float(re.search(r"all_reduce after each bucket\s*:\s*([\d.]+) ms", out).group(1))
    over = float(re.search(r"async, overlapped with compute:\s*([\d.]+) ms", out).group(1))
    verdict = next(ln for ln in out.splitlines() if "overlap saved" in ln or "overlap was SLOWER" in ln)
    if sync > over + 0.1:
        assert "overlap saved" in verdict, out
    elif over > sync + 0.1:
        assert "overlap was SLOWER" in verdict, out


def test_overlap_calls_a_loss_a_loss():
    # The run that prompted this printed "time saved: -52%" and "OK"; both signs, in words:
    spec = importlib.util.spec_from_file_location("overlap_example", EXAMPLES / "overlap.py")
    overlap = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(overlap)
    loss = overlap.describe(sync=0.100, over=0.152)
    assert loss.startswith("overlap was SLOWER by 52.0 ms per step (52% more time)") and "saved" not in loss
    gain = overlap.describe(sync=0.200, over=0.150)
    assert gain == "overlap saved 50.0 ms per step (25% faster)"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("nproc", [3, 4])
def test_ring_pipeline(nproc):
    out = ndistrun(nproc, "ring_pipeline.py")
    assert "matches dist.all_reduce" in out and "matches the single-process model" in out
    assert "[rank0]:OK" in out


@pytest.mark.timeout(180)
def test_fft2d_under_mpiexec_uses_the_mpi_backend():
    if mpiexec() is None:
        pytest.skip("mpiexec not found (pip install mpich)")
    out = _run([mpiexec(), "-n", "4", sys.executable, str(EXAMPLES / "fft2d.py")])
    assert "on 4 ranks (mpi backend)" in out and out.strip().endswith("OK")


@pytest.mark.timeout(180)
def test_fft2d_under_ndistrun_uses_the_socket_backend():
    out = ndistrun(2, "fft2d.py")
    assert "on 2 ranks (socket backend)" in out and "[rank0]:OK" in out


@pytest.mark.timeout(120)
def test_gpu_example_runs_or_says_why_not():
    out = ndistrun(1, "gpu_all_reduce.py")
    import ndist

    if ndist.cuda.is_available():
        assert "[rank0]:OK" in out
    else:
        assert "skipped: no CUDA GPU available" in out


@pytest.mark.timeout(150)
@pytest.mark.parametrize("engine", ["native", "python"])
@pytest.mark.parametrize("kill_rank,kill_step", [(2, 5), (0, 0)])
def test_elastic_training_survivors_shrink_and_match_the_replay(engine, kill_rank, kill_step):
    out = ndistrun(4, "elastic_training.py", "--kill-rank", str(kill_rank), "--kill-step", str(kill_step),
                   launch=("--on-failure", "continue", "--min-nproc", "3"), env={"NDIST_ENGINE": engine}, stderr=True)
    survivors = [r for r in range(4) if r != kill_rank]
    for r in survivors:
        assert f"[rank{r}]:OK: survivors finished with the weights of the single-process replay" in out, out
        # (died: the member watch saw it first; lost: an operation on the group found it gone first)
        assert re.search(rf"\[rank{r}\]:step {kill_step}: lost ranks \[{kill_rank}\] \((died|lost)\) of 4; "
                         "shrinking", out), out
    steps = f"steps per world size: {{4: {kill_step}, 3: {40 - kill_step}}}" if kill_step else \
        "steps per world size: {3: 40}"
    assert out.count(steps) == 3, out
    assert "finished without 1 lost rank (--on-failure continue)" in out and "killed by SIGKILL" in out, out


def test_elastic_training_replay_tells_the_schedules_apart():
    # The example's check means something: the weights depend on how many ranks shared each
    # step, and on whether the interrupted step was redone by the survivors.
    spec = importlib.util.spec_from_file_location("elastic_example", EXAMPLES / "elastic_training.py")
    elastic = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(elastic)
    x, y = elastic.dataset()
    redone, _ = elastic.replay(x, y, [4] * 5 + [3] * 35)
    for other in ([4] * 40, [3] * 40, [4] * 5 + [3] * 34, [4] * 6 + [3] * 34):
        got, _ = elastic.replay(x, y, other)
        assert max(float(abs(got[k] - redone[k]).max()) for k in elastic.NAMES) > 1e-6, other


@pytest.mark.timeout(150)
@pytest.mark.parametrize("engine", ["native", "python"])
def test_elastic_training_heals_4_3_4_and_every_rank_matches_the_replay(engine):
    # rank 2 dies at step 5; the survivors shrink to 3, ndistrun starts its replacement, the
    # survivors' grow_group admits it as rank 3, rank 0 sends it the weights and the step
    out = ndistrun(4, "elastic_training.py", "--kill-rank", "2", "--kill-step", "5", "--heal",
                   launch=("--on-failure", "replace"), env={"NDIST_ENGINE": engine}, stderr=True)
    for r in range(4):  # (the replacement prints as [rank2], its slot)
        assert f"[rank{r}]:world sizes: 4 -> 3 -> 4" in out, out
        assert f"[rank{r}]:OK: every rank finished with the weights of the single-process replay" in out, out
    assert re.search(r"\[rank2\]:joined the running job as rank 3 of 4 at step \d+ \(replacing rank 2\)", out), out
    for r in (0, 1, 3):
        assert re.search(rf"\[rank{r}\]:step \d+: admitted ranks \[3\]; the world has 4 ranks", out), out
    assert "finished; 1 lost process was replaced (--on-failure replace)" in out, out
