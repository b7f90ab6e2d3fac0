"""Rank / world-size detection from launcher environments, and backend strings."""

import pytest

from tests.runtime import _runtime_store_backend  # noqa: F401  registers "storetest"
from tests.fresh_python import prints
from ndist.runtime import Backend, register_backend
from ndist.runtime._env import detect, first_host
from ndist.runtime._group import format_backend, parse_backend


def test_nothing_set():
    e = detect({})
    assert e.source is None and e.rank is None and e.world_size is None


def test_torchrun_style_env_wins_over_launchers():
    e = detect({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                "MASTER_ADDR": "h", "MASTER_PORT": "29500", "PMI_RANK": "0", "PMI_SIZE": "2",
                "NDIST_STORE": "h:1234", "NDIST_RESTART_COUNT": "2"})
    assert (e.source, e.rank, e.world_size, e.local_rank, e.local_world_size) == ("env", 3, 8, 1, 4)
    assert (e.master_addr, e.master_port, e.agent_store, e.restart_count) == ("h", 29500, "h:1234", 2)


def test_open_mpi():
    e = detect({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6",
                "OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "3"})
    assert (e.source, e.rank, e.world_size, e.local_rank, e.local_world_size) == ("mpi", 5, 6, 2, 3)
    assert e.under_mpi and e.master_addr is None


def test_mpich_hydra_and_intel_mpi():
    e = detect({"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"})
    assert (e.source, e.rank, e.world_size, e.local_rank, e.local_world_size) == ("mpi", 1, 4, 1, 4)


def test_pmix():
    e = detect({"PMIX_RANK": "2", "PMIX_SIZE": "3"})
    assert (e.source, e.rank, e.world_size) == ("mpi", 2, 3)


def test_pmix_rank_alone_is_not_enough():
    assert detect({"PMIX_RANK": "2"}).source is None


def test_slurm_step():
    e = detect({"SLURM_PROCID": "7", "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "3",
                "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "gpu[03-04,9]", "SLURM_JOB_ID": "123456",
                "SLURM_STEP_TASKS_PER_NODE": "4(x2)"})
    assert (e.source, e.rank, e.world_size, e.local_rank, e.local_world_size) == ("slurm", 7, 8, 3, 4)
    assert e.master_addr == "gpu03"
    assert e.master_port == 20000 + 123456 % 20000


def test_slurm_respects_master_addr_and_port():
    e = detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEPID": "1", "SLURM_JOB_NODELIST": "a,b",
                "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "4000"})
    assert (e.master_addr, e.master_port) == ("10.0.0.1", 4000)


def test_slurm_batch_script_is_not_a_step():
    # sbatch's script sees SLURM_PROCID=0 and SLURM_NTASKS=N but is one process
    assert detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "n1"}).source is None


def test_bad_integer_names_the_variable():
    with pytest.raises(ValueError, match="RANK.*'x'"):
        detect({"RANK": "x", "WORLD_SIZE": "2"})


@pytest.mark.parametrize("nodes,first", [("n1", "n1"), ("n1,n2", "n1"), ("gpu[03-05,9],cpu1", "gpu03"),
                                          ("a-b[1,2]", "a-b1"), ("node[7]", "node7")])
def test_first_host(nodes, first):
    assert first_host(nodes) == first


@pytest.fixture
def scratch_registry(monkeypatch):
    """Register throw-away backends without leaking them into other tests."""
    from ndist.runtime import _registry

    _registry.registered_backends()  # load the built-ins first, then work on a copy
    monkeypatch.setattr(_registry, "_specs", dict(_registry._specs))
    return _registry._specs


def test_parse_backend_strings(scratch_registry):
    register_backend("cudatest", lambda ctx: None, devices=("cuda",))
    assert parse_backend("storetest") == {"cpu": "storetest"}
    assert parse_backend("StoreTest") == {"cpu": "storetest"}
    m = parse_backend("cpu:storetest,cuda:cudatest")
    assert m == {"cpu": "storetest", "cuda": "cudatest"}
    assert format_backend(m) == "cpu:storetest,cuda:cudatest"
    assert format_backend({"cpu": "x", "cuda": "x"}) == "x"
    with pytest.raises(ValueError, match=r"unknown backend 'nope'.*registered: \[.*'storetest'"):
        parse_backend("nope")
    with pytest.raises(ValueError, match="does not serve 'cpu'"):
        parse_backend("cpu:cudatest")
    with pytest.raises(ValueError, match="device:name"):
        parse_backend("tpu:storetest")
    with pytest.raises(ValueError, match="named twice"):
        parse_backend("cpu:storetest,cpu:storetest")
    with pytest.raises(TypeError, match="backend"):
        parse_backend(3)


def test_gloo_is_an_alias_of_socket_unless_registered_itself(scratch_registry):
    scratch_registry.pop("gloo", None)
    register_backend("socket", lambda ctx: None, devices=("cpu", "cuda"))
    assert parse_backend("gloo") == {"cpu": "socket", "cuda": "socket"}
    assert parse_backend("cpu:gloo") == {"cpu": "socket"}
    register_backend("gloo", lambda ctx: None, devices=("cpu",))
    assert parse_backend("gloo") == {"cpu": "gloo"}  # get_backend() then says "gloo", as torch


def test_backend_names_class():
    assert Backend.SOCKET == "socket" and Backend.NCCL == "nccl" and Backend.MPI == "mpi" and Backend.GLOO == "gloo"
    assert Backend("STORETEST") == "storetest"
    with pytest.raises(ValueError, match="unknown backend"):
        Backend("bogus")


@pytest.mark.timeout(60)
def test_builtin_backend_lookup_does_not_scan_installed_plugins():
    # Scanning the installed distributions for ``ndist.backends`` entry points costs every
    # rank tens of milliseconds at start-up; a built-in name never needs it, an unknown one does.
    code = (
        "import sys\n"
        "from ndist.runtime import _registry\nfrom ndist.runtime._group import parse_backend\n"
        "assert not _registry._specs, 'runtime alone registers no backend: it imports nothing above it'\n"
        "import ndist.collectives\n"
        "assert 'ndist.collectives.backends.socket' not in sys.modules, 'registering imported a backend'\n"
        "assert parse_backend('socket')['cpu'] == 'socket'\n"
        "assert _registry.is_registered('mpi') and _registry.get_backend_spec('socket').name == 'socket'\n"
        "assert not _registry._entry_points_loaded, 'plugins scanned for a built-in name'\n"
        "assert not _registry.is_registered('no-such-backend')\n"
        "assert _registry._entry_points_loaded, 'an unknown name must look at the plugins'\n"
        "print('ok')\n"
    )
    assert prints(code, timeout=50) == "ok"
