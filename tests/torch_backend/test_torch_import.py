"""torch stays optional: ``import ndist`` (and its facades) never imports torch; only
``import ndist.torch`` does, and that registers backend "ndist" once."""

import subprocess
import sys

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.torch


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          check=True).stdout.strip()


def test_ndist_and_its_facades_do_not_import_torch():
    out = _run("import sys, ndist, ndist.distributed, ndist.multiprocessing, ndist.testing\n"
               "import ndist.distributed as d; d.all_reduce, d.init_process_group\n"
               "print('torch' in sys.modules)")
    assert out == "False"


def test_import_registers_backend_ndist_for_cpu_once():
    out = _run("import importlib, torch.distributed as dist, ndist.torch\n"
               "ndist.torch.register(); importlib.reload(ndist.torch)\n"
               "print(dist.Backend.NDIST, dist.Backend.backend_list.count('ndist'), "
               "dist.Backend.backend_capability['ndist'], dist.Backend.default_device_backend_map['cpu'])")
    assert out == "ndist 1 ['cpu'] gloo"  # registered once; Gloo stays torch's default for CPU


def test_options_reject_unknown_engines():
    import ndist.torch

    with pytest.raises(ValueError, match=r"engine: expected one of \['socket', 'mpi'\], got 'nccl'"):
        ndist.torch.Options(engine="nccl")
    with pytest.raises(ValueError, match="transport"):
        ndist.torch.Options(transport="ib")
