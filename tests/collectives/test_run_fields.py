"""The repeated call's bookkeeping has two twins: ``_common.run_fields`` in Python (the
reference) and ``_crun.run_fields`` in C (used where it is built, unless
``NDIST_ENGINE=python``). Both number, record, check and fail a call alike."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from ndist.testing import run_ranks
from tests.collectives.backends._socket_bodies import op_buffers

crun = pytest.importorskip("ndist.collectives._crun", reason="the compiled extensions are not built")


def _kind(**env) -> str:
    code = "from ndist.collectives import _common; print(type(_common.run_fields).__name__)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, **env))
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_the_c_twin_is_used_where_built_and_python_when_asked():
    env = {k: v for k, v in os.environ.items() if k != "NDIST_ENGINE"}
    code = "from ndist.collectives import _common, _crun; print(_common.run_fields is _crun.run_fields)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert r.stdout.strip() == "True", r.stderr
    assert _kind(NDIST_ENGINE="python") == "function"
    assert _kind(NDIST_ENGINE="native") == "builtin_function_or_method"


def _both_twins(rank, size):
    """The same plain calls through each twin in turn, a mismatch included: the records,
    results and errors of the two halves."""
    import ndist.distributed as dist
    from ndist.collectives import _api, _common

    n = 4 * size
    full, out, part, part_out, ins, outs, uin, uout = op_buffers(rank, size, 4, 10)
    halves = []
    dist.barrier()
    for twin in (_common.run_fields, _common._run_fields_py):
        _api.run_fields = twin
        try:
            got = []
            full[:] = np.arange(n) + 10 * rank
            dist.all_reduce(full)
            got.append(full.copy())
            dist.all_reduce(full, op=dist.ReduceOp.MAX)
            got.append(full.copy())
            dist.broadcast(full, 1)
            got.append(full.copy())
            dist.all_gather_into_tensor(out, part)
            got.append(out.copy())
            dist.reduce_scatter_tensor(part_out, full)
            got.append(part_out.copy())
            dist.all_to_all_single(out, full)
            got.append(out.copy())
            dist.all_to_all_single(uout, uin, outs, ins)
            got.append(uout.copy())
            try:  # rank 0 reduces 8 elements, rank 1 4: both fail, naming each other; the group stays
                dist.all_reduce(np.ones(8 if rank == 0 else 4, np.float32))
                err = None
            except dist.DistError as exc:
                err = (type(exc).__name__, getattr(exc, "rank", None))
            dist.all_reduce(full)  # still usable
            got.append(full.copy())
            recs = dist.flight_recorder()[-9:]
            halves.append({
                "twin": type(twin).__name__,
                "got": [g.tolist() for g in got],
                "err": err,
                "records": [(e["op"], e["device"], e["dtype"], e["count_in"], e["count_out"], e["root"],
                             e["state"], (e["error"] or "").split(":")[0]) for e in recs],
                "seqs": [e["seq"] for e in recs],
                "timed": all(e["time_done"] is not None and e["time_done"] >= e["time_issued"] for e in recs),
            })
        finally:
            _api.run_fields = _common.run_fields
    return halves


@pytest.mark.timeout(120)
def test_both_twins_number_record_and_fail_alike():
    # NDIST_ENGINE=auto: the C twin is the module's choice even where the outer run forces python
    for halves in run_ranks(_both_twins, 2, timeout=90, env={"NDIST_ENGINE": "auto"}):
        c, py = halves
        assert (c["twin"], py["twin"]) == ("builtin_function_or_method", "function")
        assert c["got"] == py["got"]
        assert c["err"] is not None and c["err"] == py["err"], (c["err"], py["err"])
        assert c["records"] == py["records"], (c["records"], py["records"])
        assert [s - c["seqs"][0] for s in c["seqs"]] == list(range(9)), c["seqs"]
        assert py["seqs"][0] == c["seqs"][-1] + 1, (c["seqs"], py["seqs"])
        assert c["timed"] and py["timed"]
        assert c["err"][0] == "DistMismatchError", c["err"]
        assert c["records"][7][-2:] == ("failed", "DistMismatchError"), c["records"][7]
        assert all(r[-2] == "completed" for i, r in enumerate(c["records"]) if i != 7), c["records"]
