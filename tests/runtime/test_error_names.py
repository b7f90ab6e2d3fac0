"""The error tree is named by its public home, ndist.distributed, as torch's is."""

import pickle
import traceback

import pytest

import ndist.distributed as dist

ERRORS = ["DistError", "DistBackendError", "DistNetworkError", "DistStoreError", "DistTimeoutError",
          "DistMismatchError", "DistCaptureError"]


@pytest.mark.parametrize("name", ERRORS)
def test_error_is_named_ndist_distributed_and_round_trips(name):
    cls = getattr(dist, name)
    assert cls.__module__ == "ndist.distributed"
    exc = cls("boom") if name != "DistNetworkError" else cls("boom", rank=1, host="h")
    line = traceback.format_exception_only(type(exc), exc)[-1]
    assert line == f"ndist.distributed.{name}: boom\n"
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls and str(back) == "boom"
    assert isinstance(back, RuntimeError)
