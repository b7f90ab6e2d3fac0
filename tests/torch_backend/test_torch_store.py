"""TorchStore: torch's c10d stores (a real TCPStore on port 0, and a HashStore) through
ndist's Store interface, with ndist's errors."""

from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as tdist  # noqa: E402

from ndist.runtime import DistTimeoutError  # noqa: E402
from ndist.torch import TorchStore  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(60)]


@pytest.fixture(params=["tcp", "hash", "prefix"])
def store(request):
    if request.param == "tcp":
        inner = tdist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=5), wait_for_workers=False)
    elif request.param == "hash":
        inner = tdist.HashStore()
    else:
        inner = tdist.PrefixStore("group/cpu/", tdist.HashStore())
    inner.set_timeout(timedelta(seconds=5))
    return TorchStore(inner)


def test_key_value_operations(store):
    store.set("a", b"\x00\xff bytes")
    store.set("s", "text")
    assert store.get("a") == b"\x00\xff bytes" and store.get("s") == b"text"
    assert store.add("n", 2) == 2 and store.add("n", 3) == 5
    assert store.compare_set("c", "", "first") == b"first"
    assert store.compare_set("c", "", "second") == b"first"  # present: not replaced
    assert store.compare_set("c", "first", "third") == b"third"
    assert store.check(["a", "s"]) and not store.check(["a", "missing"])
    store.multi_set(["m1", "m2"], [b"1", "2"])
    assert store.multi_get(["m1", "m2"]) == [b"1", b"2"]
    store.append("log", b"x")
    store.append("log", "y")
    assert store.get("log") == b"xy"
    assert store.delete_key("m1") and not store.delete_key("m1")
    store.wait(["a", "s"], 1.0)
    assert store.timeout == timedelta(seconds=5)


def test_a_missing_key_is_a_timeout_naming_it(store):
    with pytest.raises(DistTimeoutError, match=r"\['nokey'\]") as info:
        store.wait(["a_key_nobody_sets", "nokey"][1:], timedelta(seconds=0.2))
    assert isinstance(info.value, TimeoutError)
    store.set_timeout(0.2)
    with pytest.raises(DistTimeoutError, match="late"):
        store.get("late")


def test_bad_arguments(store):
    with pytest.raises(TypeError, match="key: expected str"):
        store.set(1, b"x")
    with pytest.raises(TypeError, match="amount: expected int"):
        store.add("n", 1.5)
    with pytest.raises(ValueError, match="values: expected 2 values"):
        store.multi_set(["a", "b"], [b"1"])


def test_creator_rejects_foreign_pg_options():
    import ndist.torch

    opts = tdist.distributed_c10d._DistributedBackendOptions()
    opts.store = tdist.HashStore()
    with pytest.raises(TypeError, match="pg_options: expected ndist.torch.Options or None, got dict"):
        ndist.torch.create(opts, {"backend": "mpi"})
