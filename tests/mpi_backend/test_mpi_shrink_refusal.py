"""shrink_group on the mpi backend: refused with a DistBackendError that says what this
MPI lacks for ULFM, found at run time, before any message; the group stays whole.

The job runs under a real ``mpiexec -n 2``. Each rank checks the library itself (a
revoke of a private communicator, the error classes, MPICH's FT switch) and the
message must name every gap it found. docs/errors.md ("Rank loss") has the experiment
with a killed rank behind it.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

import ndist.collectives  # noqa: F401  registers the built-in backends
from ndist.runtime import registered_backends

MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")

pytestmark = [pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec"),
              pytest.mark.skipif("mpi" not in registered_backends(), reason="mpi backend not registered")]

_JOB = r"""
import json, os, pathlib, sys
import numpy as np
from mpi4py import MPI
import ndist.distributed as dist
from ndist.runtime import DistBackendError

dist.init_process_group("mpi", timeout=60)
r = dist.get_rank()
said = {}
x = np.array([float(r + 1)])
dist.all_reduce(x)
try:  # a bad argument is still refused first
    dist.shrink_group([r])
except ValueError as err:
    said["self"] = f"ValueError {err}"
try:
    dist.shrink_group([1 - r])
except DistBackendError as err:
    said["refused"] = str(err)
# what this rank finds of the library on its own, for the message to name
probe = MPI.COMM_SELF.Dup()
try:
    probe.Revoke()
    said["revoke"] = "ok"
except NotImplementedError:
    said["revoke"] = "NotImplementedError"
except MPI.Exception as err:
    said["revoke"] = f"MPI error {err.Get_error_class()}"
probe.Free()
said["classes_equal"] = MPI.ERR_PROC_FAILED == MPI.ERR_REVOKED
said["mpich_ft_off"] = (MPI.Get_library_version().startswith("MPICH")
                        and os.environ.get("MPIR_CVAR_ENABLE_FT", "0") in ("", "0"))
y = np.array([float(r + 1)])
dist.all_reduce(y)  # the group is still whole
said["after"] = float(y[0])
said["size"] = dist.get_world_size()
# one file per rank: mpiexec merges the ranks' stdout, and two lines can interleave mid-line
pathlib.Path(sys.argv[1], f"rank{r}.json").write_text(json.dumps(said))
dist.destroy_process_group()
"""


@pytest.mark.timeout(180)
def test_mpi_shrink_is_refused_naming_what_the_library_lacks(tmp_path):
    pytest.importorskip("mpi4py")
    script = tmp_path / "job.py"
    script.write_text(_JOB)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "NDIST_STORE", "NDIST_SECRET",
                        "MPIR_CVAR_ENABLE_FT", "MPICH_ENABLE_FT", "MPIR_PARAM_ENABLE_FT")}
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, str(script), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    for r in (0, 1):
        said = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert said["self"].startswith("ValueError ranks_to_exclude: expected the ranks of other members"), said
        msg = said["refused"]
        assert msg.startswith("shrink_group: group '0' uses backend(s) ['mpi'], which cannot shrink: "), msg
        assert "ULFM" in msg and "docs/errors.md, 'Rank loss'" in msg, msg
        if said["revoke"] == "NotImplementedError":
            assert "does not bind the library's ULFM calls (Comm.Revoke raises NotImplementedError" in msg, msg
        if said["classes_equal"]:
            assert "MPI.ERR_PROC_FAILED and MPI.ERR_REVOKED are the same class" in msg, msg
        if said["mpich_ft_off"]:
            assert "MPICH's fault tolerance is off (MPIR_CVAR_ENABLE_FT is not set" in msg, msg
        if said["revoke"] == "ok" and not said["classes_equal"] and not said["mpich_ft_off"]:
            assert "does not use MPI's ULFM yet" in msg, msg
        assert (said["after"], said["size"]) == (3.0, 2), said
