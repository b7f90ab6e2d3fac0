"""tests/mpi runs only under ``mpiexec -n N python -m pytest --with-mpi tests/mpi``.

The plain ``pytest`` run ignores this directory (it never imports mpi4py at
collection time) and launches the suite itself from tests/test_mpi_suite.py.
"""

import pytest


def pytest_ignore_collect(collection_path, config):
    try:
        with_mpi = config.getoption("--with-mpi")
    except ValueError:  # pytest-mpi not installed
        with_mpi = False
    return None if with_mpi else True


@pytest.fixture(scope="session")
def comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD
