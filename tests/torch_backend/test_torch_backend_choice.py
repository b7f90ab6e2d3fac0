"""Which ndist backend runs under torch's backend "ndist": ``Options(backend=...)``, else
``$NDIST_TORCH_BACKEND``, else ``"socket"``. The old names (``Options(engine=...)``,
``$NDIST_TORCH_ENGINE``, from before "engine" meant only the socket backend's native or
Python engine) still work, each with one deprecation notice."""

import logging
import warnings
from datetime import timedelta

import pytest

pytest.importorskip("torch")

pytestmark = [pytest.mark.torch]


@pytest.fixture
def backend_env(monkeypatch):
    from ndist.torch import _backend

    monkeypatch.delenv(_backend.BACKEND_ENV, raising=False)
    monkeypatch.delenv(_backend.OLD_BACKEND_ENV, raising=False)
    monkeypatch.setattr(_backend, "_told_old", [])  # the once-per-process notice, fresh
    return monkeypatch


def test_the_backend_comes_from_options_then_the_variable_then_the_default(backend_env):
    from ndist.torch import Options

    assert Options().resolved_backend() == "socket"
    backend_env.setenv("NDIST_TORCH_BACKEND", "mpi")
    assert Options().resolved_backend() == "mpi"
    assert Options(backend="socket").resolved_backend() == "socket"


def test_the_old_variable_is_read_when_the_new_one_is_unset_with_one_notice(backend_env, caplog):
    from ndist.torch import Options

    backend_env.setenv("NDIST_TORCH_ENGINE", "mpi")
    with caplog.at_level(logging.WARNING, logger="ndist.torch"):
        assert Options().resolved_backend() == "mpi"
        assert Options().resolved_backend() == "mpi"
    told = [r for r in caplog.records if "NDIST_TORCH_ENGINE is deprecated" in r.getMessage()]
    assert len(told) == 1 and "NDIST_TORCH_BACKEND" in told[0].getMessage(), caplog.text
    backend_env.setenv("NDIST_TORCH_BACKEND", "socket")  # the new name wins
    assert Options().resolved_backend() == "socket"


def test_a_bad_value_names_the_variable_that_was_set(backend_env):
    from ndist.torch import make_process_group
    import torch.distributed as dist

    backend_env.setenv("NDIST_TORCH_BACKEND", "nccl")
    with pytest.raises(ValueError, match=r"NDIST_TORCH_BACKEND: expected one of \['socket', 'mpi'\], got 'nccl'"):
        make_process_group(dist.HashStore(), 0, 1, timedelta(seconds=10))
    backend_env.delenv("NDIST_TORCH_BACKEND")
    backend_env.setenv("NDIST_TORCH_ENGINE", "gloo")
    with pytest.raises(ValueError, match=r"NDIST_TORCH_ENGINE: expected one of \['socket', 'mpi'\], got 'gloo'"):
        make_process_group(dist.HashStore(), 0, 1, timedelta(seconds=10))


def test_the_old_keyword_still_works_with_a_deprecation_warning():
    from ndist.torch import Options

    with pytest.warns(DeprecationWarning, match=r"Options\(engine=\.\.\.\) is deprecated: use backend="):
        opts = Options(engine="mpi")
    assert opts.backend == "mpi" and opts.resolved_backend() == "mpi"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new keyword warns nothing
        assert Options(backend="mpi") == opts
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="engine: the old name of backend"):
        Options(backend="socket", engine="mpi")
