"""Process groups over real processes, with the test-only store backend
(``_runtime_store_backend``: real registry -> BackendContext -> backend path)."""

import os
import socket

import numpy as np
import pytest

from tests.runtime import _runtime_store_backend  # noqa: F401  registers "storetest" here and in every rank
import ndist.distributed as dist
from ndist.runtime import DistTimeoutError, TCPStore
from ndist.testing import RankFailedError, run_ranks

B = "storetest"


def _testing_store():
    host, _, port = os.environ["NDIST_STORE"].rpartition(":")
    return TCPStore(host, int(port), timeout=30)


def _free_port_published(rank, key):
    """Rank 0 binds port 0, closes it and publishes the number through run_ranks' store."""
    st = _testing_store()
    if rank == 0:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        st.set(key, str(port))
    port = int(st.get(key))
    st.close()
    return port


def _basics(rank, ws):
    pg = dist.resolve_group(None)
    x = np.array([rank + 1.0, 10.0 * rank])
    dist.all_reduce(x, group=pg)
    return dict(
        rank=dist.get_rank(), ws=dist.get_world_size(), backend=dist.get_backend(), init=dist.is_initialized(),
        sum=x.tolist(), world_ranks=dist.get_process_group_ranks(dist.group.WORLD), world_rank=dist.group.WORLD.rank(),
    )


@pytest.mark.timeout(90)
def test_init_through_launcher_store_and_backend_from_registry():
    out = run_ranks(_basics, 3, backend=B)
    for r, o in enumerate(out):
        assert o["rank"] == r and o["ws"] == 3 and o["init"] and o["world_rank"] == r
        assert o["backend"] == B
        assert o["sum"] == [6.0, 30.0]
        assert o["world_ranks"] == [0, 1, 2]


def _env_init_rank0_hosts(rank, ws):
    port = _free_port_published(rank, "env-port")
    # what a user's job script / launcher sets; no launcher store this time
    os.environ.pop("NDIST_STORE")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(B, init_method="env://", timeout=30)
    pg = dist.resolve_group(None)
    from ndist.runtime._world import _world

    hosted = _world.rdzv.store.is_master
    dist.barrier(group=pg)
    dist.destroy_process_group()
    return rank, hosted


@pytest.mark.timeout(90)
def test_env_rendezvous_with_rank0_hosting_the_store():
    assert run_ranks(_env_init_rank0_hosts, 3, init=False) == [(0, True), (1, False), (2, False)]


def _tcp_init(rank, ws):
    port = _free_port_published(rank, "tcp-port")
    dist.init_process_group(B, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ws, timeout=30)
    x = np.array([float(rank)])
    dist.all_gather([np.zeros(1) for _ in range(ws)], x)
    r = dist.get_rank(), dist.get_world_size()
    dist.destroy_process_group()
    return r


@pytest.mark.timeout(90)
def test_tcp_rendezvous():
    assert run_ranks(_tcp_init, 2, init=False) == [(0, 2), (1, 2)]


def _file_init(rank, ws, path, declared):
    dist.init_process_group(B, init_method=f"file://{path}", rank=rank, world_size=declared, timeout=3)
    r = dist.get_rank(), dist.get_world_size()
    dist.destroy_process_group()
    return r


@pytest.mark.timeout(90)
def test_file_rendezvous(tmp_path):
    assert run_ranks(_file_init, 2, args=(str(tmp_path / "rdzv"), 2), init=False) == [(0, 2), (1, 2)]


@pytest.mark.timeout(90)
def test_missing_rank_is_named_not_waited_for_forever(tmp_path):
    with pytest.raises(RankFailedError) as info:
        run_ranks(_file_init, 3, args=(str(tmp_path / "rdzv"), 4), init=False)
    msg = str(info.value)
    assert "3 of 4 ranks joined within 3 s; missing: [3]" in msg
    assert isinstance(info.value.exception, DistTimeoutError)


def _store_init(rank, ws):
    st = _testing_store()
    dist.init_process_group(B, store=st, rank=rank, world_size=ws)
    r = dist.get_rank()
    dist.destroy_process_group()
    st.close()
    return r


@pytest.mark.timeout(90)
def test_init_with_an_explicit_store():
    assert run_ranks(_store_init, 2, init=False) == [0, 1]


def _duplicate_rank(rank, ws):
    st = _testing_store()
    dist.init_process_group(B, store=st, rank=0, world_size=ws, timeout=5)


@pytest.mark.timeout(90)
def test_two_processes_claiming_one_rank_is_an_error():
    with pytest.raises(RankFailedError, match="rank 0 was already claimed"):
        run_ranks(_duplicate_rank, 2, init=False)


def _lifecycle_errors(rank, ws):
    errs = {}
    try:
        dist.get_rank()
    except ValueError as e:
        errs["before"] = str(e)
    dist.init_process_group(B, timeout=30)
    try:
        dist.init_process_group(B)
    except RuntimeError as e:
        errs["twice"] = str(e)
    dist.destroy_process_group()
    try:
        dist.resolve_group(None)
    except ValueError as e:
        errs["after"] = str(e)
    errs["init_after"] = dist.is_initialized()
    # and init again after destroy works (fresh keys: no clash with the first round)
    dist.init_process_group(B, timeout=30)
    dist.barrier()
    dist.destroy_process_group()
    return errs


@pytest.mark.timeout(90)
def test_use_before_init_double_init_and_use_after_destroy():
    out = run_ranks(_lifecycle_errors, 2, init=False)
    for errs in out:
        assert "Default process group has not been initialized" in errs["before"]
        assert errs["twice"] == "trying to initialize the default process group twice!"
        assert "Default process group has not been initialized" in errs["after"]
        assert errs["init_after"] is False


def _subgroups(rank, ws):
    odd = dist.new_group([3, 1])
    even = dist.new_group([0, 2])
    mine = odd if rank % 2 else even
    other = even if rank % 2 else odd
    x = np.array([float(rank)])
    dist.all_reduce(x, group=mine)
    res = dict(
        sum=x[0], grank=mine.rank(), other_rank=other.rank(), other_ws=dist.get_world_size(other),
        ranks=dist.get_process_group_ranks(mine), g2g=dist.get_global_rank(mine, 1),
        gr=dist.get_group_rank(mine, rank),
    )
    try:
        other.backend_for("cpu")
    except ValueError as e:
        res["nonmember"] = str(e)
    try:
        dist.get_group_rank(other, rank)
    except ValueError as e:
        res["not_in"] = str(e)
    cur, subs = dist.new_subgroups(2)
    y = np.array([1.0])
    dist.all_reduce(y, group=cur)
    res["sub"] = (cur.ranks, [s.ranks for s in subs], y[0])
    try:  # the default group size is the CUDA device count, as in torch: none here
        dist.new_subgroups()
        res["sub_default"] = "no error"
    except ValueError as e:
        res["sub_default"] = str(e)
    dist.destroy_process_group(odd)
    try:
        odd.backend_for("cpu")
    except ValueError as e:
        res["destroyed"] = str(e)
    return res


@pytest.mark.timeout(120)
def test_new_group_and_subgroups():
    out = run_ranks(_subgroups, 4, backend=B)
    for r, o in enumerate(out):
        assert o["sum"] == (4.0 if r % 2 else 2.0)
        assert o["grank"] == r // 2 and o["gr"] == r // 2
        assert o["ranks"] == ([1, 3] if r % 2 else [0, 2])  # sorted, as torch
        assert o["g2g"] == (3 if r % 2 else 2)
        assert o["other_rank"] == -1 and o["other_ws"] == -1
        assert f"global rank {r} is not a member" in o["nonmember"] and ("[0, 2]" in o["nonmember"] or "[1, 3]" in o["nonmember"])
        assert "is not part of group" in o["not_in"]
        assert o["sub"] == (((0, 1) if r < 2 else (2, 3)), [(0, 1), (2, 3)], 2.0)
        assert o["sub_default"].startswith("group_size: not given"), o["sub_default"]
        assert "has been destroyed" in o["destroyed"]


def _bad_group_args(rank, ws):
    errs = []
    for call in (
        lambda: dist.new_group([0, 5]),
        lambda: dist.new_group([0, 0]),
        lambda: dist.new_group(["0"]),
        lambda: dist.new_subgroups(3),
        lambda: dist.init_process_group("nope"),
        lambda: dist.get_global_rank(dist.group.WORLD, 9),
    ):
        try:
            call()
            errs.append(None)
        except (ValueError, TypeError, RuntimeError) as e:
            errs.append(f"{type(e).__name__}: {e}")
    return errs


@pytest.mark.timeout(90)
def test_bad_group_arguments_name_the_argument():
    errs = run_ranks(_bad_group_args, 2, backend=B)[0]
    assert errs[0].startswith("ValueError: ranks") and "5" in errs[0]
    assert errs[1].startswith("ValueError: ranks") and "distinct" in errs[1]
    assert errs[2].startswith("TypeError: ranks")
    assert errs[3].startswith("ValueError: group_size")
    assert errs[4].startswith("RuntimeError: trying to initialize")
    assert errs[5].startswith("ValueError: group_rank")


def _mismatched_new_group_order(rank, ws):
    # ranks 0/1 create {0,1} first, ranks 2/3 create {2,3} first: both become group "1"
    first, second = ([0, 1], [2, 3]) if rank < 2 else ([2, 3], [0, 1])
    g = dist.new_group(first)
    dist.new_group(second)
    st = _testing_store()
    if rank % 2 == 0:  # group rank 0 of each: let one claim first so the other must see it
        if rank == 2:
            st.wait(["claimed"])
        try:
            g.backend_for("cpu")
        finally:
            if rank == 0:
                st.set("claimed", "1")
    return "ok"


@pytest.mark.timeout(90)
def test_new_group_in_different_orders_is_detected():
    with pytest.raises(RankFailedError) as info:
        run_ranks(_mismatched_new_group_order, 4, backend=B)
    assert info.value.rank == 2
    assert "claimed by global ranks 0 and 2" in str(info.value)
    assert "same order" in str(info.value)


def _barrier_and_rank(rank, ws):
    dist.barrier()
    return dist.get_rank()


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", [16, 64])
def test_many_ranks_rendezvous_on_one_store(n):
    assert run_ranks(_barrier_and_rank, n, backend=B, timeout=360) == list(range(n))
