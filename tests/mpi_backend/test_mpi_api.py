"""The public API over the mpi backend, inside one MPI job of any size:
the whole conformance suite, async Work progress and the error cases."""

import numpy as np
import pytest

from tests.collectives import conformance

pytestmark = [pytest.mark.mpi(min_size=1), pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def dist():
    import ndist.distributed as d

    if not d.is_initialized():
        d.init_process_group("mpi")
    return d


def test_default_group_is_mpi(dist, comm):
    assert dist.get_rank() == comm.rank and dist.get_world_size() == comm.size
    assert dist.get_backend() == "mpi"


def test_conformance_suite(dist):
    results = conformance.run_all(dist)
    failed = {k: v for k, v in results.items() if v}
    assert not failed, "\n\n".join(f"{k}:\n{v}" for k, v in failed.items())


def test_async_all_to_all_single_returns_mpi_work(dist):
    n = dist.get_world_size()
    inp = np.arange(2 * n, dtype=np.float64) + 100 * dist.get_rank()
    out = np.empty_like(inp)
    work = dist.all_to_all_single(out, inp, async_op=True)
    assert work.wait() is True
    assert work.is_completed() and work.exception() is None
    want = np.concatenate([np.arange(2 * n)[2 * dist.get_rank():2 * dist.get_rank() + 2] + 100 * r for r in range(n)])
    np.testing.assert_array_equal(out, want)
    assert work.result()[0] is out
    fut = dist.all_reduce(np.ones(3), async_op=True).get_future()
    assert fut.result(timeout=30)[0].tolist() == [n] * 3


@pytest.mark.mpi(min_size=2)
def test_error_cases_keep_the_group_usable(dist, comm):
    if comm.size != 2:
        pytest.skip("the error cases' messages are written for 2 ranks (run by tests/collectives/test_errors.py)")
    from tests.collectives import error_cases

    failed = {k: v for k, v in error_cases.run_cases(dist).items() if v}
    assert not failed, failed
