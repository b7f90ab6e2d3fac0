"""The flight recorder in torch's dump format (``NDIST_FR_DUMP``, collectives/_fr_torch.py):
a mismatch or a hang on 2 ranks writes one pickle per rank, and torch's own analyzer
(``python -m torch.distributed.flight_recorder.fr_trace``) reads them and names the
collective that went wrong."""

import os
import pickle
import subprocess
import sys

import pytest

from ndist.testing import run_ranks

N_GOOD = 3  # matched all_reduces before the bad one, which is #4


def _mismatch(rank, size, kind):
    import numpy as np

    import ndist.distributed as dist

    for _ in range(N_GOOD):
        dist.all_reduce(np.ones(2, np.float32))
    x = np.ones(4, np.float32)
    try:
        if kind == "op" and rank == 1:
            dist.all_gather([np.empty(4, np.float32) for _ in range(size)], x)
        elif kind == "dtype" and rank == 1:
            dist.all_reduce(np.ones(4, np.float64))
        else:
            dist.all_reduce(x)
    except dist.DistMismatchError as err:
        return "torch" in sys.modules, str(err)
    return "torch" in sys.modules, None


def _hang(rank, size):
    """Rank 1 skips all_reduce #4 and waits for a message rank 0 never sends: rank 1 times
    out, and rank 0 (in the all_reduce) learns that rank 1 left or times out too."""
    from datetime import timedelta

    import numpy as np

    import ndist.distributed as dist

    g = dist.new_group([0, 1], timeout=timedelta(seconds=3))
    for _ in range(N_GOOD):
        dist.all_reduce(np.ones(2, np.float32), group=g)
    try:
        if rank == 0:
            dist.all_reduce(np.ones(8, np.float32), group=g)
        else:
            dist.recv(np.empty(8, np.float32), src=0, group=g)
    except (dist.DistTimeoutError, dist.DistNetworkError) as err:
        return str(err)
    return None


def _dumps(folder, prefix="ndist_fr_"):
    return {int(n[len(prefix):]): pickle.load(open(os.path.join(folder, n), "rb"))
            for n in sorted(os.listdir(folder)) if n.startswith(prefix)}


@pytest.mark.timeout(90)
def test_a_mismatch_writes_one_dump_per_rank_in_torchs_layout_without_torch(tmp_path):
    res = run_ranks(_mismatch, 2, args=("op",), timeout=60, env={"NDIST_FR_DUMP": str(tmp_path / "ndist_fr_")})
    assert all(msg is not None for _, msg in res), res
    assert not any(had_torch for had_torch, _ in res)  # the writer needs no torch
    dumps = _dumps(tmp_path)
    assert sorted(dumps) == [0, 1]
    for rank, d in dumps.items():
        assert d["version"] == "2.10" and d["comm_lib_version"].startswith("ndist")
        (name, cfg), = d["pg_config"].items()
        assert cfg == {"name": name, "desc": "default_pg", "ranks": "[0, 1]"}
        entries = d["entries"]
        assert [e["record_id"] for e in entries] == list(range(N_GOOD + 1))
        assert [e["collective_seq_id"] for e in entries] == [1, 2, 3, 4]
        assert all(e["state"] == "completed" for e in entries[:N_GOOD])
        assert entries[0]["profiling_name"] == "gloo:all_reduce" and entries[0]["input_sizes"] == [[2]]
        assert entries[0]["input_dtypes"] == ["Float"] and entries[0]["process_group"] == (name, "default_pg")
        last = entries[-1]
        assert last["state"] == "started" and last["time_discovered_completed_ns"] is None
        assert last["profiling_name"] == ("gloo:all_reduce" if rank == 0 else "gloo:all_gather")
        assert d["pg_status"][name]["last_completed_collective"] == N_GOOD
        assert d["pg_status"][name]["last_enqueued_collective"] == N_GOOD + 1


def _analyze(folder, out):
    """torch's analyzer on ``folder``: its log (stderr) and the database it pickles."""
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder),
                           "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pytest.importorskip("torch")
    with open(out, "rb") as f:
        _types, db = pickle.load(f)
    return proc.stdout + proc.stderr, db


@pytest.mark.torch
@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind, culprit", [("op", "COLLECTIVE_TYPE_MISMATCH"),
                                           ("dtype", "COLLECTIVE_DTYPE_MISMATCH")])
def test_torchs_analyzer_reports_the_mismatched_collective(tmp_path, kind, culprit):
    pytest.importorskip("torch")
    dump_dir = tmp_path / "dumps"
    res = run_ranks(_mismatch, 2, args=(kind,), timeout=60, env={"NDIST_FR_DUMP": str(dump_dir / "ndist_fr_")})
    assert all(msg is not None for _, msg in res), res
    log, db = _analyze(dump_dir, tmp_path / "db.pkl")
    assert "Collective sequence number: 4 has errors" in log, log
    assert culprit in log, log
    good = [c for c in db.collectives if c.pass_check]
    bad = [c for c in db.collectives if not c.pass_check]
    assert [c.collective_seq_id for c in good] == [1, 2, 3]
    assert [c.collective_seq_id for c in bad] == [4] and bad[0].collective_name == "gloo:all_reduce"
    (rank, other), = bad[0].mismatch_collectives.items()
    assert rank == 1 and culprit in str(other.type_of_mismatch)


@pytest.mark.torch
@pytest.mark.timeout(150)
def test_torchs_analyzer_names_the_collective_a_rank_never_joined(tmp_path):
    pytest.importorskip("torch")
    dump_dir = tmp_path / "dumps"
    res = run_ranks(_hang, 2, timeout=90, env={"NDIST_FR_DUMP": str(dump_dir / "ndist_fr_")})
    assert all(msg is not None for msg in res), res
    assert sorted(_dumps(dump_dir)) == [0, 1]
    log, db = _analyze(dump_dir, tmp_path / "db.pkl")
    assert "Not all ranks joining collective, sequence number: 4" in log, log
    assert "missing ranks: {1}" in log, log
    # (the analyzer keeps pass_check for a collective that is only missing ranks)
    seen = [(c.collective_seq_id, c.collective_name, c.missing_ranks) for c in db.collectives]
    assert seen[:N_GOOD] == [(i, "gloo:all_reduce", None) for i in range(1, N_GOOD + 1)]
    assert seen[N_GOOD] == (4, "gloo:all_reduce", {1})
