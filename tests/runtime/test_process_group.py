"""ProcessGroup in one process (world of 1 on a HashStore) with the test-only store backend."""

from datetime import timedelta

import numpy as np

from tests.backend_driver import Driver
import pytest

from tests.runtime import _runtime_store_backend
from ndist.runtime import DistBackendError, HashStore, ProcessGroup, register_backend
from ndist.runtime import _registry


def _group(ranks=(0,), me=0, backends=None, store=None):
    return ProcessGroup(tuple(ranks), me, "g", store or HashStore(timeout=2), backends or {"cpu": "storetest"},
                        timeout=timedelta(seconds=2))


def test_backend_created_once_with_a_prefixed_store_and_closed_on_shutdown():
    store = HashStore(timeout=2)
    pg = _group(store=store)
    b = pg.backend_for("cpu")
    assert isinstance(b, _runtime_store_backend.StoreBackend)
    assert pg.backend_for("cpu") is b
    ctx = b.ctx
    assert (ctx.rank, ctx.size, ctx.group_name, ctx.global_ranks, ctx.device) == (0, 1, "g", (0,), "cpu")
    x = np.array([2.0])
    Driver(b).all_reduce(x, _runtime_store_backend.ReduceOp.SUM).wait()
    assert x[0] == 2.0
    ctx.store.set("probe", "1")
    assert store.get("storetest/cpu/probe") == b"1"  # namespaced per backend and device
    pg._shutdown()
    assert b.closed and pg.destroyed
    with pytest.raises(ValueError, match="destroyed"):
        pg.backend_for("cpu")


def test_rank_translation_and_membership():
    pg = _group(ranks=(1, 4, 6), me=4)
    assert (pg.rank(), pg.size(), pg.is_member) == (1, 3, True)
    assert pg.group_rank(6) == 2 and pg.global_rank(0) == 1
    with pytest.raises(ValueError, match="rank 5 is not part of group 'g'"):
        pg.group_rank(5)
    with pytest.raises(ValueError, match=r"group_rank: expected an int in \[0, 3\)"):
        pg.global_rank(3)
    outsider = _group(ranks=(1, 4, 6), me=0)
    assert outsider.rank() == -1 and not outsider.is_member
    with pytest.raises(ValueError, match=r"global rank 0 is not a member of group 'g' with ranks \[1, 4, 6\]"):
        outsider.backend_for("cpu")


def test_device_without_backend_and_unavailable_backend(monkeypatch):
    monkeypatch.setattr(_registry, "_specs", dict(_registry._specs))
    pg = _group()
    with pytest.raises(ValueError, match="no backend for 'cuda'"):
        pg.backend_for("cuda")
    register_backend("never", _runtime_store_backend.create, devices=("cpu",), is_available=lambda: False)
    with pytest.raises(DistBackendError, match="backend 'never' cannot run on this machine"):
        _group(backends={"cpu": "never"}).backend_for("cpu")


@pytest.mark.parametrize("kwargs,exc,pattern", [
    (dict(timeout=-1), ValueError, "timeout: expected a positive, finite duration, got -1"),
    (dict(timeout=float("nan")), ValueError, "timeout: expected a positive, finite duration, got nan"),
    (dict(timeout=float("inf")), ValueError, "timeout: expected a positive, finite duration, got inf"),
    (dict(timeout="10"), TypeError, "timeout: expected datetime.timedelta"),
    (dict(world_size="2"), TypeError, "world_size: expected int, got str"),
    (dict(rank=1.0), TypeError, "rank: expected int, got float"),
    (dict(init_method="env://", store=HashStore()), ValueError, "init_method: cannot specify both"),
    (dict(store=HashStore(), rank=0), ValueError, "world_size: expected a positive int when a store is given, got -1"),
    (dict(store=HashStore(), rank=2, world_size=2), ValueError, r"rank: expected 0 <= rank < world_size \(2\)"),
    (dict(store="localhost:1234", rank=0, world_size=1), TypeError, "store: expected an ndist Store, got str"),
    (dict(backend="nope", store=HashStore(), rank=0, world_size=1), ValueError, "unknown backend 'nope'"),
    (dict(init_method="udp://h:1", rank=0, world_size=1), ValueError, r"no rendezvous handler for udp://.*env://"),
    (dict(init_method="tcp://nohostport", rank=0, world_size=1), ValueError, "expected 'tcp://host:port'"),
    (dict(group_name=3, store=HashStore(), rank=0, world_size=1), TypeError, "group_name: expected str"),
])
def test_init_argument_errors_before_any_communication(kwargs, exc, pattern):
    import ndist.distributed as dist

    kwargs.setdefault("backend", "storetest")
    with pytest.raises(exc, match=pattern):
        dist.init_process_group(**kwargs)
    assert not dist.is_initialized()


def test_single_process_world_on_a_hash_store():
    import ndist.distributed as dist

    dist.init_process_group("storetest", store=HashStore(timeout=5), rank=0, world_size=1)
    try:
        assert (dist.get_rank(), dist.get_world_size(), dist.get_backend()) == (0, 1, "storetest")
        assert dist.group.WORLD.size() == 1 and repr(dist.group.WORLD) == "group.WORLD"
        assert dist.resolve_group(dist.GroupMember.WORLD) is dist.resolve_group(None)
        with pytest.raises(TypeError, match="group: expected a ProcessGroup"):
            dist.get_rank(group="world")
    finally:
        dist.destroy_process_group()
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        dist.destroy_process_group()
