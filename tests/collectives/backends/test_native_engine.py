"""The native same-host engine: chosen where it can run, visible from the API, and a
clean fallback (one warning, the Python engine) where the extension is not built.

The collectives themselves are held to the Python engine by the conformance suite,
which the README's test command runs on the default engine (native where the extension
is built) and ``.ci/run`` again with ``NDIST_ENGINE=python``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig

import numpy as np
import pytest

from ndist.testing import run_ranks
from tests.fresh_python import without

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _have_compiler() -> bool:
    include = sysconfig.get_paths().get("include") or ""
    return (shutil.which(os.environ.get("CC", "cc")) is not None or shutil.which("gcc") is not None) \
        and os.path.exists(os.path.join(include, "Python.h"))


def test_the_extension_is_built_where_a_compiler_exists():
    if not _have_compiler():
        pytest.skip("no C compiler or Python headers: the Python engine is the expected outcome")
    if os.environ.get("NDIST_BUILD_NATIVE", "1") == "0":
        pytest.skip("NDIST_BUILD_NATIVE=0 skipped the build")
    from ndist.collectives import _crun  # noqa: F401 - the assertion is the import
    from ndist.collectives.backends.socket.native import _cnative  # noqa: F401


def _engines(rank, size):
    import ndist.distributed as dist

    before = dist.get_engine()
    x = np.full(1000, rank + 1, np.float64)
    dist.all_reduce(x)
    assert (x == size * (size + 1) / 2).all()
    return before, dist.get_engine()


@pytest.mark.parametrize("engine", ["", "auto", "native"], ids=["default", "auto", "native"])
def test_same_host_groups_run_native_and_say_so(engine):
    pytest.importorskip("ndist.collectives.backends.socket.native._cnative")
    assert run_ranks(_engines, 2, timeout=60, env={"NDIST_ENGINE": engine}) == [("native", "native")] * 2


@pytest.mark.parametrize("env", [{"NDIST_ENGINE": "python"}, {"NDIST_ENGINE": "auto", "NDIST_TRANSPORT": "tcp"}],
                         ids=["engine", "tcp"])
def test_python_engine_when_asked(env):
    assert run_ranks(_engines, 2, timeout=60, env=env) == [("python", "python")] * 2


def test_bad_engine_name_is_a_value_error(monkeypatch):
    from ndist.collectives.backends.socket.native import _engine as _native

    monkeypatch.setenv("NDIST_ENGINE", "fast")
    with pytest.raises(ValueError, match="NDIST_ENGINE: expected 'auto', 'native' or 'python', got 'fast'"):
        _native.engine_mode()


# An interpreter where importing the extensions fails, as on a machine where they were not built.
_BLOCK = without("ndist.collectives.backends.socket.native._cnative", "ndist.collectives._crun")


@pytest.fixture
def no_extension(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(_BLOCK)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}


def _fallback_job(rank, size):
    import logging

    import ndist.distributed as dist

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    logging.getLogger("ndist").addHandler(Keep(level=logging.WARNING))
    for _ in range(3):  # three groups' worth of first use: still one warning
        g = dist.new_group(list(range(size)))
        x = np.full(10, rank + 1, np.int64)
        dist.all_reduce(x, group=g)
        assert (x == 3).all()
        assert dist.get_engine(g) == "python"
    from ndist.collectives import _common

    assert _common.run_fields is _common._run_fields_py  # the bookkeeping's Python twin
    return [r.getMessage() for r in records if r.levelno == logging.WARNING and "native engine" in r.getMessage()]


@pytest.mark.parametrize("engine", ["", "auto"], ids=["default", "auto"])
def test_without_the_extension_ndist_runs_python_with_one_warning(no_extension, engine):
    got = run_ranks(_fallback_job, 2, timeout=90, env=dict(no_extension, NDIST_ENGINE=engine))
    for msgs in got:
        assert len(msgs) == 1, msgs
        assert "not built" in msgs[0] and "C compiler" in msgs[0] and "Python engine" in msgs[0]


def _forced_native(rank, size):
    import ndist.distributed as dist

    try:
        dist.all_reduce(np.ones(4))
    except RuntimeError as err:
        return str(err)
    return None


def test_without_the_extension_forcing_native_is_an_error(no_extension):
    env = dict(no_extension, NDIST_ENGINE="native")
    got = run_ranks(_forced_native, 2, timeout=60, env=env)
    for msg in got:
        assert msg is not None and "NDIST_ENGINE=native" in msg and "not built" in msg, msg


def test_install_without_a_compiler_still_succeeds(tmp_path):
    """setup.py's build_ext warns and goes on when the compiler fails (CC=false)."""
    env = dict(os.environ, CC="false", LDSHARED="false")
    out = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib"),
                          "--build-temp", str(tmp_path / "tmp")], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ndist's native engine was not built" in out.stderr and "Python engine" in out.stderr
    built = [f for _, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".so")]
    assert built == []

