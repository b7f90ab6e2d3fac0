"""nccl backend set-up that needs no GPU: registration, lazy imports, availability,
the unique-id exchange through the store and ctx.options parsing."""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import timedelta

import pytest

from ndist.collectives.backends.nccl import _comm, is_available
from ndist.runtime import BackendContext, DistTimeoutError, HashStore, get_backend_spec


def test_registered_for_cuda_only_with_lazy_probe():
    spec = get_backend_spec("nccl")
    assert spec.devices == ("cuda",)
    assert spec.needs_store is True


def test_import_loads_neither_cupy_nor_the_backend_module():
    code = (
        "import sys, ndist, ndist.collectives, ndist.collectives.backends.nccl as n\n"
        "from ndist.runtime import get_backend_spec\n"
        "get_backend_spec('nccl')\n"
        "bad = [m for m in ('cupy', 'ndist.collectives.backends.nccl._backend') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.skipif(__import__("importlib").util.find_spec("cupy") is not None, reason="CuPy is installed here")
def test_not_available_without_cupy():
    assert is_available() is False
    assert get_backend_spec("nccl").available() is False


def test_uid_bytes_round_trip_through_signed_and_unsigned_tuples():
    raw = bytes(range(0, 256, 2))
    signed = _comm.uid_from_bytes(raw, signed=True)
    assert min(signed) < 0 and all(-128 <= b <= 127 for b in signed)
    assert _comm.uid_to_bytes(signed) == raw
    assert _comm.uid_to_bytes(_comm.uid_from_bytes(raw, signed=False)) == raw
    assert _comm.uid_to_bytes(raw) == raw


def test_uid_of_wrong_length_is_rejected():
    with pytest.raises(ValueError, match="128 bytes, got 3"):
        _comm.uid_to_bytes(b"abc")


@pytest.mark.parametrize("options,expected", [(None, None), (3, 3), ({"device_id": 1}, 1), ({}, None)])
def test_device_from_options(options, expected):
    assert _comm.device_from_options(options) == expected


def test_device_from_options_object_and_errors():
    class Opts:
        device_id = 2

    assert _comm.device_from_options(Opts()) == 2
    with pytest.raises(TypeError, match="options.device_id: expected an int, got str"):
        _comm.device_from_options({"device_id": "0"})
    with pytest.raises(TypeError, match="options"):
        _comm.device_from_options(True)


def _ctx(store, rank, size, timeout=10.0):
    return BackendContext(store=store, rank=rank, size=size, timeout=timedelta(seconds=timeout),
                          group_name="g", global_ranks=tuple(range(size)), device="cuda")


@pytest.mark.timeout(60)
def test_unique_id_exchange_gives_every_rank_rank0s_id():
    # Threads sharing one in-process HashStore: this tests the key protocol only.
    store = HashStore()
    uid = bytes((7 * i) % 256 for i in range(128))
    calls = []
    results: dict[int, bytes] = {}

    def make_uid():
        calls.append(1)
        return tuple(b - 256 if b > 127 else b for b in uid)  # old CuPy's form

    def rank(r):
        results[r] = _comm.exchange_unique_id(_ctx(store, r, 3), make_uid)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (2, 1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {0: uid, 1: uid, 2: uid}
    assert len(calls) == 1  # only rank 0 made an id


@pytest.mark.timeout(60)
def test_missing_rank_is_a_timeout_naming_its_key():
    store = HashStore()
    with pytest.raises(DistTimeoutError, match="nccl_joined/1"):
        _comm.exchange_unique_id(_ctx(store, 0, 2, timeout=0.3), lambda: bytes(128))


def test_communicator_device_takes_options_then_the_groups_device_index():
    def ctx(options=None, device_index=None):
        return BackendContext(store=HashStore(), rank=0, size=1, timeout=timedelta(seconds=1), group_name="g",
                              global_ranks=(0,), device="cuda", options=options, device_index=device_index)

    assert _comm.communicator_device(ctx()) is None  # the device current at construction
    assert _comm.communicator_device(ctx(device_index=3)) == 3  # bound device_id / LOCAL_RANK default
    assert _comm.communicator_device(ctx(options={"device_id": 1}, device_index=3)) == 1
