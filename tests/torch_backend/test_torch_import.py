"""torch stays optional: ``import ndist`` (and its facades) never imports torch; only
``import ndist.torch`` does, and that registers backend "ndist" once."""

import subprocess
import sys

import pytest

pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.every_torch_release]


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


def test_options_reject_unknown_backends():
    import ndist.torch

    with pytest.raises(ValueError, match=r"backend: expected one of \['socket', 'mpi'\], got 'nccl'"):
        ndist.torch.Options(backend="nccl")
    with pytest.raises(ValueError, match="transport"):
        ndist.torch.Options(transport="ib")


def test_the_installed_torch_is_supported():
    import torch

    from ndist.torch import _version

    _version.check(torch.__version__)  # the torch this suite runs on (2.13.0 and 2.14.1 in CI)
    assert _version.parse(torch.__version__) in _version.RELEASES


def test_the_supported_releases_are_2_13_and_2_14():
    from ndist.torch import _version

    assert _version.RELEASES == ((2, 13), (2, 14))
    assert _version.SUPPORTED == ">=2.13,<2.15"


@pytest.mark.parametrize("version", ["2.13.0", "2.13.0+cpu", "2.13.1", "2.13.0a0+git1f2e3d", "2.13.2+cu130",
                                     "2.14.0", "2.14.1", "2.14.1+cu130", "2.14.1+cpu", "2.14.0.dev20260101",
                                     "2.14.0a0+gitabc123"])
def test_supported_versions_pass(version):
    from ndist.torch import _version

    _version.check(version)


# the policy (docs/torch.md, "Supported torch releases"): a release CI has not run is refused
# at import, the next one (2.15, its pre-releases included) as much as an older one
@pytest.mark.parametrize("version", ["2.12.1", "2.12.0+cpu", "2.6.0", "1.13.1", "2.15.0", "2.15.0a0+git1234",
                                     "2.15.0.dev20261201", "2.16.0", "3.0.0", "", "nightly"])
def test_other_versions_fail_naming_installed_and_supported(version):
    from ndist.torch import _version

    with pytest.raises(ImportError) as info:
        _version.check(version)
    msg = str(info.value)
    assert f"torch {version} is installed" in msg
    assert "supports torch >=2.13,<2.15 (torch 2.13 and 2.14)" in msg


@pytest.mark.parametrize("version", ["2.12.1", "2.15.0"])
def test_import_fails_clearly_under_an_unsupported_torch(version):
    out = subprocess.run([sys.executable, "-c", f"import torch; torch.__version__ = {version!r}; import ndist.torch"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1] == (
        f"ImportError: ndist.torch supports torch >=2.13,<2.15 (torch 2.13 and 2.14); torch {version} is installed. "
        "Install a supported torch (pip install 'ndist[torch]'), or use ndist without ndist.torch.")


def test_the_torch_extra_states_the_supported_range():
    import os

    from ndist.torch import _version

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "pyproject.toml")) as f:
        extra = [line for line in f if line.startswith("torch = [")]
    assert len(extra) == 1 and f'"torch{_version.SUPPORTED}"' in extra[0], extra
