"""torch 2.13 names that ndist.distributed lacked (issue #15): availability and
debug-level queries, split_group, get_pg_count, get_backend_config,
get_node_local_rank, init_device_mesh / DeviceMesh, QueueEmptyError, and
new_subgroups() without group_size on CPU."""

import importlib.util

import numpy as np
import pytest

import ndist.distributed as dist
from ndist.testing import run_ranks


def test_availability_queries():
    assert dist.is_gloo_available() is True
    assert dist.is_mpi_available() is (importlib.util.find_spec("mpi4py") is not None)
    assert dist.is_nccl_available() is False or importlib.util.find_spec("cupy") is not None
    assert dist.is_ucc_available() is False and dist.is_xccl_available() is False
    assert dist.is_backend_available("gloo") and dist.is_backend_available("socket")
    assert dist.is_backend_available("cpu:gloo") and dist.is_backend_available("CPU:socket")
    assert dist.is_backend_available("nonsense") is False
    assert dist.is_backend_available("cpu:socket,cuda:nccl") is dist.is_nccl_available()
    with pytest.raises(TypeError, match="backend: expected str"):
        dist.is_backend_available(None)


def test_default_backend_for_device_and_backend_config():
    assert dist.get_default_backend_for_device("cpu") == "socket"
    assert dist.get_default_backend_for_device("cuda:1") == "nccl"
    import ndist

    assert dist.get_default_backend_for_device(ndist.device("cpu")) == "socket"
    with pytest.raises(ValueError, match="device: no default backend for device 'xpu'"):
        dist.get_default_backend_for_device("xpu")
    cfg = dist.BackendConfig("cpu:gloo")
    assert repr(cfg) in ("cpu:gloo", "cpu:socket") and list(cfg.get_device_backend_map()) == ["cpu"]
    with pytest.raises(ValueError, match="backend"):
        dist.BackendConfig("nonsense")


def test_supports_complex_is_torchs_answer():
    R = dist.ReduceOp
    assert [dist.supports_complex(op) for op in (R.SUM, R.AVG, R.PREMUL_SUM)] == [True] * 3
    assert not any(dist.supports_complex(op) for op in (R.MAX, R.MIN, R.PRODUCT, R.BAND, R.BOR, R.BXOR))
    assert dist.supports_complex(dist._make_nccl_premul_sum(2.0))
    with pytest.raises(TypeError, match="reduceOp"):
        dist.supports_complex("sum")


def test_node_local_rank_and_torchelastic(monkeypatch):
    for var in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NDIST_RUN_ID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(RuntimeError, match="LOCAL_RANK is not in the environment"):
        dist.get_node_local_rank()
    assert dist.get_node_local_rank(fallback_rank=3) == 3
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert dist.get_node_local_rank(fallback_rank=3) == 1
    assert dist.is_torchelastic_launched() is False
    monkeypatch.setenv("NDIST_RUN_ID", "job")
    assert dist.is_torchelastic_launched() is True


def test_queue_empty_error_is_a_store_error():
    assert issubclass(dist.QueueEmptyError, dist.DistStoreError)
    assert issubclass(dist.QueueEmptyError, dist.DistError)


def test_debug_level(monkeypatch):
    monkeypatch.setenv("NDIST_DEBUG", "DETAIL")
    dist.set_debug_level_from_env()
    assert dist.get_debug_level() is dist.DebugLevel.DETAIL
    dist.set_debug_level(dist.DebugLevel.OFF)
    assert dist.get_debug_level() is dist.DebugLevel.OFF
    with pytest.raises(TypeError, match="level"):
        dist.set_debug_level("DETAIL")
    monkeypatch.setenv("NDIST_DEBUG", "INFO")
    dist.set_debug_level_from_env()
    assert dist.get_debug_level() is dist.DebugLevel.INFO
    monkeypatch.delenv("NDIST_DEBUG")
    assert dist.get_debug_level() is dist.DebugLevel.OFF
    assert [m.name for m in dist.DebugLevel] == ["OFF", "INFO", "DETAIL"]


def _set_detail(rank, ws):
    """set_debug_level(DETAIL) turns on the signature check of groups created afterwards."""
    dist.set_debug_level(dist.DebugLevel.DETAIL)
    g = dist.new_group([0, 1])
    x = np.ones(4, np.float32)
    try:
        dist.all_reduce(x, op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX, group=g)
        return None
    except dist.DistMismatchError as err:
        return str(err)


@pytest.mark.timeout(90)
def test_set_debug_level_detail_checks_new_groups():
    for msg in run_ranks(_set_detail, 2, timeout=60, env={"NDIST_DEBUG": ""}):
        assert msg is not None and "NDIST_DEBUG=DETAIL" in msg and "MAX" in msg, msg


def _subgroups_default(rank, ws):
    try:
        dist.new_subgroups()
    except ValueError as err:
        return str(err)
    return "no error"


@pytest.mark.timeout(90)
def test_new_subgroups_without_group_size_raises_on_cpu_like_torch():
    out = run_ranks(_subgroups_default, 2, timeout=60, env={"LOCAL_WORLD_SIZE": "2"})
    for msg in out:
        assert msg.startswith("group_size: not given") and "CUDA" in msg, msg


def _groups_and_meshes(rank, ws):
    out = {"pg_count0": dist.get_pg_count(), "config": dist.get_backend_config()}
    # split_group: group ranks of the parent; rank 3 is in no split
    half = dist.split_group(split_ranks=[[0, 2], [1]])
    out["split"] = None if half is None else dist.get_process_group_ranks(half)
    if half is not None:
        t = np.array([rank + 1.0])
        dist.all_reduce(t, group=half)
        out["split_sum"] = t.tolist()
    sub = dist.new_group([1, 2, 3])
    if rank in (1, 2, 3):
        inner = dist.split_group(sub, [[0, 1], [2]])  # group ranks of sub: globals [1, 2] and [3]
        t = np.array([float(rank)])
        dist.all_reduce(t, group=inner)
        out["inner"] = (dist.get_process_group_ranks(inner), t.tolist())
    out["pg_count"] = dist.get_pg_count()
    # a 2 x 2 mesh: dp pairs (0, 2) and (1, 3); tp pairs (0, 1) and (2, 3)
    mesh = dist.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh["dp"], mesh["tp"]
    x = np.array([float(rank)])
    dist.all_reduce(x, group=mesh.get_group("dp"))
    y = np.array([float(rank)])
    dist.all_reduce(y, group=tp.get_group())
    out["mesh"] = dict(
        repr=repr(mesh), shape=mesh.shape, ndim=mesh.ndim, size=mesh.size(), size_tp=mesh.size("tp"),
        coord=mesh.get_coordinate(), dp_local=mesh.get_local_rank("dp"), tp_local=mesh.get_local_rank(1),
        dp_ranks=dp.mesh.tolist(), tp_ranks=tp.mesh.tolist(), dp_sum=x.tolist(), tp_sum=y.tolist(),
        same=dp.get_group() is mesh.get_group(0), full=mesh["dp", "tp"] is mesh,
        swapped=mesh["tp", "dp"].mesh.tolist(), groups=len(mesh.get_all_groups()),
    )
    try:
        mesh.get_group()
    except RuntimeError as err:
        out["mesh"]["no_dim"] = "mesh_dim" in str(err)
    try:
        dist.init_device_mesh("cpu", (3,))
    except ValueError as err:
        out["mesh"]["bad_shape"] = str(err)
    return out


@pytest.mark.timeout(180)
def test_split_group_pg_count_backend_config_and_device_mesh():
    out = run_ranks(_groups_and_meshes, 4, timeout=150)
    for r, o in enumerate(out):
        assert o["pg_count0"] == 1 and o["config"].startswith("cpu:socket")
        assert o["split"] == {0: [0, 2], 1: [1], 2: [0, 2], 3: None}[r]
        if r in (0, 2):
            assert o["split_sum"] == [4.0]
        if r in (1, 2):
            assert o["inner"] == ([1, 2], [3.0])
        if r == 3:
            assert o["inner"] == ([3], [3.0])
        m = o["mesh"]
        assert m["repr"] == "DeviceMesh((dp=2, tp=2), 'cpu', stride=(2, 1))"
        assert m["shape"] == (2, 2) and m["ndim"] == 2 and m["size"] == 4 and m["size_tp"] == 2
        assert m["coord"] == (r // 2, r % 2)
        assert m["dp_local"] == r // 2 and m["tp_local"] == r % 2
        assert m["dp_ranks"] == [r % 2, r % 2 + 2] and m["tp_ranks"] == [r // 2 * 2, r // 2 * 2 + 1]
        assert m["dp_sum"] == [float(2 * (r % 2) + 2)] and m["tp_sum"] == [float(4 * (r // 2) + 1)]
        assert m["same"] and m["full"] and m["groups"] == 2 and m["no_dim"]
        assert m["swapped"] == [[0, 2], [1, 3]] if r == 0 else True
        assert m["bad_shape"].startswith("mesh_shape: expected a shape of 4 ranks"), m["bad_shape"]
    # the default group and new_group([1, 2, 3]) everywhere, plus the splits each rank is in
    # (rank 0: [0, 2]; ranks 1, 2: one of each split_group; rank 3: only the inner [3])
    assert [o["pg_count"] for o in out] == [3, 4, 4, 3]


def test_init_device_mesh_checks_arguments_before_anything_else():
    cases = [
        (("cuda:0", (2,)), {}, ValueError, "device_type: expected a device type without an index"),
        (("cpu", (2, 0)), {}, ValueError, "mesh_shape: expected a tuple of positive ints"),
        (("cpu", 4), {}, TypeError, "mesh_shape: expected a tuple of int"),
        (("cpu", (2, 2)), {"mesh_dim_names": ("dp",)}, ValueError, "mesh_dim_names: expected 2 names"),
        (("cpu", (2, 2)), {"mesh_dim_names": ("dp", "dp")}, ValueError, "mesh_dim_names: expected unique"),
        (("cpu", (2, 2)), {"mesh_dim_names": ("dp", "tp"), "backend_override": {"pp": "socket"}}, ValueError,
         "backend_override: 'pp' is not a mesh dimension name"),
        (("cpu", (2, 2)), {"backend_override": {0: "socket", -2: "socket"}}, ValueError,
         "backend_override: dimension 0 is given twice"),
    ]
    for args, kwargs, exc, text in cases:
        with pytest.raises(exc, match=text):
            dist.init_device_mesh(*args, **kwargs)
    assert not dist.is_initialized()
