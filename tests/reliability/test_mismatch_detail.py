"""Collective mismatch detection through the public API, across processes:
the socket backend's frame-header check (every op) and ``NDIST_DEBUG=DETAIL``'s
store-based signature check (every backend; here socket and MPI). Both name
both calls on the ranks involved, and the next matched collective works."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ndist.testing import run_ranks

ROOT = Path(__file__).resolve().parents[2]


def _op_mismatch(rank, size):
    import numpy as np

    import ndist.distributed as dist

    for _ in range(16):  # the mismatch is #17
        dist.all_reduce(np.ones(2, np.float32))
    x = np.ones(4, np.float32)
    try:
        if rank == 0:
            dist.all_reduce(x)
        else:
            dist.all_gather([np.empty(4, np.float32) for _ in range(size)], x)
        msg = None
    except dist.DistMismatchError as err:
        msg = str(err)
    y = np.full(5, rank + 1.0)
    dist.all_reduce(y)
    return msg, y.tolist(), [e["state"] for e in dist.flight_recorder()][-2:]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("debug", ["", "DETAIL"])
def test_op_mismatch_names_both_calls_and_the_group_recovers(debug):
    res = run_ranks(_op_mismatch, 2, timeout=60, env={"NDIST_DEBUG": debug})
    for msg, y, states in res:
        assert msg is not None
        assert "rank 0: all_reduce float32[4]" in msg and "#17" in msg, msg
        assert "rank 1: all_gather float32[4]" in msg, msg
        if debug:
            assert "NDIST_DEBUG=DETAIL" in msg
        assert y == [3.0] * 5
        assert states == ["failed", "completed"]


def _detail_only(rank, size):
    """Mismatches the socket frame header cannot see (reduce op), or sees only on
    one side, caught on every rank by NDIST_DEBUG=DETAIL before any byte is sent."""
    import numpy as np

    import ndist.distributed as dist

    msgs = []
    try:
        dist.all_reduce(np.ones(3), op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX)
    except dist.DistMismatchError as err:
        msgs.append(str(err))
    osz = [1, 3] if rank == 0 else [2, 1]  # rank 0 expects 3 from rank 1, which sends 2
    isz = [1, 2] if rank == 0 else [2, 1]
    try:
        dist.all_to_all_single(np.empty(sum(osz), np.int32), np.arange(sum(isz), dtype=np.int32), osz, isz)
    except dist.DistMismatchError as err:
        msgs.append(str(err))
    y = np.full(2, rank, np.int64)
    dist.broadcast(y, src=1)
    return msgs, y.tolist()


@pytest.mark.timeout(90)
def test_detail_catches_reduce_op_and_split_mismatches_on_every_rank():
    res = run_ranks(_detail_only, 2, timeout=60, env={"NDIST_DEBUG": "DETAIL"})
    for rank, (msgs, y) in enumerate(res):
        assert len(msgs) == 2, (rank, msgs)
        assert "SUM" in msgs[0] and "MAX" in msgs[0], msgs[0]
        assert "all_to_all" in msgs[1] and "3" in msgs[1] and "2" in msgs[1], msgs[1]
        assert y == [1, 1]
    assert "rank 0: all_to_all_single int32[3] #2 expects 3 elements from rank 1; rank 1: all_to_all_single int32[3] #2 sends 2" \
        in res[0][0][1]


def _info_logging(rank, size):
    import numpy as np

    import ndist.distributed as dist

    dist.all_reduce(np.ones(1))
    return True


@pytest.mark.timeout(60)
def test_ndist_debug_info_logs_to_stderr(capfd):
    run_ranks(_info_logging, 2, timeout=40, env={"NDIST_DEBUG": "INFO"})
    err = capfd.readouterr().err
    assert "ndist.runtime" in err and "INFO" in err and "initialised" in err, err[-2000:]


_MPI_JOB = r"""
import sys
import numpy as np
import ndist.distributed as dist

dist.init_process_group("mpi")
rank, size = dist.get_rank(), dist.get_world_size()
log = open(f"{sys.argv[1]}/rank{rank}.txt", "w")  # not stdout: mpiexec may interleave the ranks' lines
x = np.ones(4, np.float32)
dist.all_reduce(x)
try:
    if rank == 0:
        dist.all_reduce(x)
    else:
        dist.all_gather([np.empty(4, np.float32) for _ in range(size)], x)
    print(f"rank {rank}: NO ERROR", file=log, flush=True)
except dist.DistMismatchError as err:
    print(f"rank {rank}: MISMATCH {err}", file=log, flush=True)
# rank 1 sends 2 elements to rank 0, which expects 1: MPI_Alltoallv would fail or
# truncate; DETAIL names both calls first
sizes = [2, 1] if rank == 1 else [1, 1]
try:
    dist.all_to_all_single(np.empty(2, np.int64), np.full(sum(sizes), rank, np.int64), [1, 1], sizes)
    print(f"rank {rank}: NO ERROR", file=log, flush=True)
except dist.DistMismatchError as err:
    print(f"rank {rank}: SPLITS {err}", file=log, flush=True)
y = np.full(3, rank + 1.0)
dist.all_reduce(y)
print(f"rank {rank}: NEXT {y.tolist()}", file=log, flush=True)
dist.destroy_process_group()
"""


@pytest.mark.timeout(120)
def test_detail_on_mpi_through_the_world_store(tmp_path):
    pytest.importorskip("mpi4py")
    local = Path(sys.executable).parent / "mpiexec"
    exe = str(local) if local.exists() else shutil.which("mpiexec")
    if exe is None:
        pytest.skip("mpiexec not found")
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(_MPI_JOB))
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env.update(PYTHONPATH=str(ROOT), NDIST_DEBUG="DETAIL")
    proc = subprocess.run([exe, "-n", "2", sys.executable, str(job), str(tmp_path)], capture_output=True, text=True,
                          timeout=100, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    for r in (0, 1):
        out = (tmp_path / f"rank{r}.txt").read_text()
        line = next((ln for ln in out.splitlines() if ln.startswith(f"rank {r}: MISMATCH")), out)
        assert "rank 0: all_reduce float32[4] SUM #2" in line and "rank 1: all_gather float32[4] #2" in line, line
        line = next((ln for ln in out.splitlines() if ln.startswith(f"rank {r}: SPLITS")), out)
        assert "expects 1 elements from rank 1" in line or "sends 2 elements to rank 0" in line, line
        assert f"rank {r}: NEXT [3.0, 3.0, 3.0]" in out, out
