"""The compiled backend (ndist/torch/csrc/ndist_backend.cpp, built by ndist/torch/_compiled.py)
and the custom ops ``torch.ops.ndist.*``: results bitwise equal to Gloo's through the engine's
C interface, DDP equal to Gloo, a peer killed mid-op giving the Python backend's error type,
the ops under ``torch.compile(fullgraph=True)``, the build cached, and the Python backend with
one warning where no compiler is found.

The module is built once per test run, into the run's ``$TORCH_EXTENSIONS_DIR``
(tests/conftest.py, ``torch_compiled_build``); every rank process loads it from there."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")

from tests.torch_backend.torch_helpers import run_torch, run_torch_and_gloo, run_torch_with_victim  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(600)]

_LOG_SETUP = ("import logging, sys; logging.basicConfig(stream=sys.stdout, level=logging.INFO, "
              "format='%(levelname)s %(name)s %(message)s')\n")


@pytest.fixture
def compiled(torch_compiled_build, monkeypatch):
    """Rank processes started by the test use the compiled backend (it must build)."""
    monkeypatch.setenv("NDIST_TORCH_COMPILED", "1")
    return torch_compiled_build


def _python_backend(monkeypatch):
    monkeypatch.setenv("NDIST_TORCH_COMPILED", "0")


# ------------------------------------------------------------------- the build and its cache
def test_the_build_logs_once_and_a_second_process_loads_the_cache(compiled):
    no_cache_yet, log = compiled
    # the session's build said it compiled at most once, and only where there was no cached
    # module yet (with none, another worker's build under the same lock may have made it)
    said = log.count("compiling ndist's torch backend")
    assert said <= 1 and (said == 0 or no_cache_yet), log
    assert "LOADED True" in log, log
    out = subprocess.run([sys.executable, "-c", _LOG_SETUP + "import ndist.torch.ops as o; print('LOADED', o.load())"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "LOADED True" in out.stdout, out.stdout
    assert "compiling" not in out.stdout + out.stderr, out.stdout + out.stderr


def test_without_a_compiler_the_python_backend_serves_after_one_warning(torch_compiled_build, tmp_path):
    script = _LOG_SETUP + textwrap.dedent("""
        import os
        from datetime import timedelta
        import torch, torch.distributed as dist
        import ndist.torch, ndist.torch.ops as ops
        dist.init_process_group("ndist", init_method="file://" + os.path.join(sys.argv[1], "store"), rank=0,
                                world_size=1, timeout=timedelta(seconds=60))
        sub = dist.new_group([0])
        t = torch.arange(4.0)
        dist.all_reduce(t)
        dist.all_reduce(t, group=sub)
        print("RESULT", t.tolist(), ops.engine_calls(), type(dist.group.WORLD).__name__)
        dist.destroy_process_group()
    """)
    env = dict(os.environ, CXX="/nonexistent/c++", NDIST_TORCH_COMPILED="auto",
               TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"))
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                         timeout=300, env=env)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert text.count("WARNING ndist.torch ndist's compiled torch backend could not be built") == 1, text
    assert "RESULT [0.0, 1.0, 2.0, 3.0] -1 ProcessGroupNdist" in out.stdout, text


def test_forced_without_a_compiler_raises(torch_compiled_build, tmp_path):
    script = "import ndist.torch.ops as o\no.load()\n"
    env = dict(os.environ, CXX="/nonexistent/c++", NDIST_TORCH_COMPILED="1", TORCH_EXTENSIONS_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode != 0
    assert "RuntimeError: NDIST_TORCH_COMPILED=1: ndist's compiled torch backend could not be built" in out.stderr


def test_extra_flags_reach_the_compiler_and_are_cached_apart(torch_compiled_build, tmp_path, monkeypatch):
    """NDIST_TORCH_CFLAGS (the sanitizer build): another build name, and the flag is the
    compiler's (a flag it does not know fails the build)."""
    from ndist.torch import _compiled

    monkeypatch.delenv("NDIST_TORCH_CFLAGS", raising=False)
    monkeypatch.delenv("NDIST_TORCH_LDFLAGS", raising=False)  # (set in a sanitizer run: docs/native.md)
    plain = _compiled._name()
    monkeypatch.setenv("NDIST_TORCH_CFLAGS", "-DNDIST_PROBE=1")
    assert _compiled._name() != plain and _compiled._flags() == (["-DNDIST_PROBE=1"], [])
    script = "import ndist.torch.ops as o\no.load()\n"
    env = dict(os.environ, NDIST_TORCH_COMPILED="1", TORCH_EXTENSIONS_DIR=str(tmp_path),
               NDIST_TORCH_CFLAGS="-fno-such-flag-for-ndist")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode != 0 and "could not be built" in out.stderr, out.stderr[-2000:]
    assert "-fno-such-flag-for-ndist" in out.stderr, out.stderr[-2000:]


def test_unset_the_switch_means_the_compiled_backend_where_it_builds(monkeypatch):
    from ndist.torch import _compiled

    monkeypatch.delenv("NDIST_TORCH_COMPILED", raising=False)
    assert _compiled.mode() == "auto"


def test_the_compile_message_shows_and_a_stale_lock_is_removed(torch_compiled_build, tmp_path):
    """A build is announced where a user sees it (a WARNING: Python's last-resort handler prints
    it with no logging configured); a build killed midway leaves torch's lock file behind, and
    the next build removes it instead of waiting on it forever; its ninja and compilers, which
    do not hold ndist's lock, may still run in the folder, and the next build waits for them
    first. (The session's build folder less its module: only the link runs again.)"""
    import shutil

    from ndist.torch import _compiled

    name = _compiled._name()
    directory = tmp_path / "ext" / name
    shutil.copytree(_compiled.build_directory(name), directory)
    (directory / f"{name}.so").unlink()
    (directory / "lock").touch()  # what a killed build leaves (torch's FileBaton)
    # a process still working in the folder, as a killed build's compiler does
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], cwd=directory)
    env = dict(os.environ, NDIST_TORCH_COMPILED="1", TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"))
    loader = subprocess.Popen([sys.executable, "-c", "import ndist.torch.ops as o; print('LOADED', o.load())"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    said = []
    try:
        for line in loader.stderr:  # (until it says it waits; to its end if it never does)
            said.append(line)
            if "waiting for" in line:
                break
        assert f"waiting for {leftover.pid} (python" in said[-1], said
        assert f" left running in {directory} by a build" in said[-1], said
        time.sleep(0.5)
        assert loader.poll() is None and not (directory / f"{name}.so").exists()  # it waits, builds nothing
    finally:
        leftover.kill()
        leftover.wait()
        stdout, stderr = loader.communicate(timeout=600)
    out = subprocess.CompletedProcess(loader.args, loader.returncode, stdout, "".join(said) + stderr)
    assert out.returncode == 0 and "LOADED True" in out.stdout, out.stdout + out.stderr
    assert out.stderr.count(f"compiling ndist's torch backend {name} for torch") == 1, out.stderr
    assert (directory / f"{name}.so").exists()
    from torch.utils import cpp_extension

    if hasattr(cpp_extension, "FileBaton"):  # torch 2.13: a lock file whose existence blocks
        assert f"removed {directory / 'lock'}, left by a build" in out.stderr, out.stderr
        assert not (directory / "lock").exists()
    else:  # torch 2.14: an advisory lock (its FileLock), the file no sign of a killed build
        assert "removed" not in out.stderr, out.stderr


def _shrink_compiled(rank, world):
    import torch
    import torch.distributed as dist

    import ndist.torch.ops as ops

    dist.all_reduce(torch.ones(1))  # the engine set up
    if rank == 2:
        return None  # leaves (destroys its group) without calling shrink_group: the others exclude it
    new = dist.shrink_group([2])
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)  # (the new group's first collective sets its engine up: the Python group's)
    dist.all_reduce(t)
    backend = new._get_backend(torch.device("cpu"))
    return (new is dist.group.WORLD, new.rank(), new.size(), t.item(), type(backend).__name__,
            ops.engine_calls(new), dist.get_process_group_ranks(new))


def test_shrink_group_on_the_compiled_backend(compiled, tmp_path):
    """torch's own shrink path (the backend's ``shrink``, then torch's last step, which clones
    the store) gives a new default group with a compiled backend that runs on the engine."""
    out = run_torch(_shrink_compiled, 3, "ndist", tmp_path, group_timeout=30)
    for rank in (0, 1):
        is_world, r, size, total, kind, calls, ranks = out[rank]
        assert (is_world, r, size, total, kind, ranks) == (True, rank, 2, 6.0, "NdistBackend", [0, 1]), out[rank]
        assert calls == 1, calls  # the second all_reduce, on the engine


def _async_overlaps(rank, world):
    import torch
    import torch.distributed as dist

    import ndist.torch.ops as ops

    store = dist.distributed_c10d._get_default_store()
    dist.barrier()  # the engine set up
    before = ops.engine_calls()
    t = torch.full((1 << 14,), float(rank + 1))
    state = None
    if rank == 0:
        work = dist.all_reduce(t, async_op=True)  # the peer has not called it: this returns at once
        pending = work.is_completed()
        store.set("issued", "1")
        fut = work.get_future()
        work.wait()
        fut.wait()  # (its completion may reach the future a moment after the Work's)
        state = (pending, work.is_completed(), work.is_success(), work.exception() is None, fut.done())
    else:
        store.wait(["issued"])  # (the old compiled path blocked rank 0 above until its timeout)
        dist.all_reduce(t, async_op=True).wait()
    async_calls = ops.engine_calls() - before
    dist.all_reduce(t)  # blocking: through the engine, after the async op
    return state, t[0].item(), async_calls, ops.engine_calls() - before


def test_an_async_op_runs_in_the_background(compiled, tmp_path):
    """async_op=True (and so DDP's buckets, FSDP's and the functional collectives) runs in the
    Python group's background lane, not on the caller's thread; its Work tells the truth."""
    out = run_torch(_async_overlaps, 2, "ndist", tmp_path, group_timeout=20)
    assert out[0][0] == (False, True, True, True, True), out[0]
    for rank in range(2):
        _, value, async_calls, calls = out[rank]
        assert value == 6.0 and async_calls == 0 and calls == 1, out[rank]


def test_a_bad_switch_value_is_named(monkeypatch):
    from ndist.torch import _compiled

    monkeypatch.setenv("NDIST_TORCH_COMPILED", "yes")
    with pytest.raises(ValueError, match=r"NDIST_TORCH_COMPILED: expected one of \['auto', '1', '0'\], got 'yes'"):
        _compiled.mode()


# ------------------------------------------------------------------ results equal to Gloo's
_DTYPES = ("float32", "float64", "int64", "bfloat16")


def _every_op(rank, world):
    import torch
    import torch.distributed as dist

    import ndist.torch.ops as ops

    R = dist.ReduceOp
    out = {}
    warm = torch.ones(1)
    dist.all_reduce(warm)  # the group's first collective sets the engine up (the Python group's)
    for name in _DTYPES:
        dtype = getattr(torch, name)
        floating = dtype.is_floating_point
        gen = torch.Generator().manual_seed(1 + rank)
        base = (torch.randn(1200, generator=gen) * 100) if floating else torch.randint(-1000, 1000, (1200,), generator=gen)
        base = base.to(dtype)
        reds = [R.SUM, R.MIN, R.MAX, R.PRODUCT] + ([R.BAND, R.BOR, R.BXOR] if not floating else [])
        for op in reds:
            t = base.clone() if op != R.PRODUCT else (base[:8].clone() if floating else base[:8].clamp(-3, 3).clone())
            dist.all_reduce(t, op=op)
            out[f"allreduce-{name}-{op}"] = t
        if floating and dist.get_backend() == "ndist":  # Gloo has no AVG: the test compares with SUM / world
            t = base.clone()
            dist.all_reduce(t, op=R.AVG)
            out[f"allreduce-{name}-avg"] = t
        t = base.clone()
        dist.broadcast(t, src=1)
        out[f"broadcast-{name}"] = t
        g = torch.empty(world * 1200, dtype=dtype)
        dist.all_gather_into_tensor(g, base)
        out[f"allgather-{name}"] = g
        rs = torch.empty(1200 // world, dtype=dtype)
        dist.reduce_scatter_tensor(rs, base[: (1200 // world) * world].contiguous())
        out[f"reducescatter-{name}"] = rs
        a2a = torch.empty(1200, dtype=dtype)
        dist.all_to_all_single(a2a, base)
        out[f"alltoall-{name}"] = a2a
        # split sizes (rows of 3): rank r sends 2q + r + 1 rows to rank q
        isz, osz = [2 * q + rank + 1 for q in range(world)], [2 * rank + q + 1 for q in range(world)]
        v_in = base[: 3 * sum(isz)].reshape(-1, 3).contiguous()
        v_out = torch.empty(sum(osz), 3, dtype=dtype)
        dist.all_to_all_single(v_out, v_in, osz, isz)
        out[f"alltoallv-{name}"] = v_out
    dist.barrier()
    calls = ops.engine_calls()
    # the Python group's ops under the compiled backend (not counted): a list form, a rooted
    # op; and an async op's Work and future (counted)
    base = torch.arange(8, dtype=torch.float32) * (rank + 1)
    parts = [torch.empty(8) for _ in range(world)]
    dist.all_gather(parts, base)
    out["fallback-allgather"] = torch.stack(parts)
    t = base.clone()
    dist.reduce(t, dst=0)
    if rank == 0:  # (elsewhere the tensor's contents are the backend's: Gloo's scratch)
        out["fallback-reduce"] = t
    t = base.clone()
    work = dist.all_reduce(t, async_op=True)
    out["async-state"] = torch.tensor([work.wait(), work.is_completed(), work.is_success()])
    out["async-future"] = work.get_future().wait()[0]
    return out, calls


#: 4 ranks as 2 "hosts" of 2 on this machine, every call in two levels (the C interface on a
#: two-level group: native/ctwo.c)
_TWO_LEVELS = {"NDIST_NATIVE_HOSTS": "2", "NDIST_NATIVE_TWO_LEVEL_MIN": "0"}


@pytest.mark.parametrize("world, env", [(2, None), (3, None), (4, _TWO_LEVELS)], ids=["2", "3", "two-levels-4"])
def test_every_mapped_op_is_bitwise_equal_to_gloo(compiled, tmp_path, world, env):
    ours, gloo = run_torch_and_gloo(_every_op, world, tmp_path, env=env, timeout=240)
    for rank in range(world):
        results, calls = ours[rank]
        expected, _ = gloo[rank]
        # every op after the first went through the engine's C interface
        mapped = [k for k in results if not k.startswith(("fallback-", "async-"))]
        assert calls == len(mapped) + 1, (calls, len(mapped))  # + the barrier
        assert results["async-state"].tolist() == [True, True, True], rank
        assert torch.equal(results["async-future"], results["async-future"].new_tensor(
            sum(range(1, world + 1)) * torch.arange(8.0))), rank
        for key, value in expected.items():
            if key.startswith("async-") and not key.endswith("future"):
                continue  # (Gloo's Work may still be running when asked)
            if world == 2 or not value.is_floating_point() or not key.startswith(("allreduce", "reducescatter")):
                assert torch.equal(results[key], value), (rank, key)
            else:  # Gloo adds 3 or 4 ranks' floats in another order than ndist (rank order; two
                # levels: each host's, then the hosts'): a few ulps of the operands (|x| < 1000: ulp 6.1e-5
                # in float32), however small the sum
                tol = ({"atol": 4.0, "rtol": 0.02} if value.dtype == torch.bfloat16 else
                       {"atol": 5e-4, "rtol": 1e-5} if value.dtype == torch.float32 else {})
                torch.testing.assert_close(results[key], value, msg=f"{rank} {key}", **tol)
            assert torch.equal(results[key], ours[0][0][key]) or not key.startswith("allreduce"), (rank, key)
        for name in ("float32", "float64", "bfloat16"):
            summed = results[f"allreduce-{name}-{torch.distributed.ReduceOp.SUM}"]
            assert torch.equal(results[f"allreduce-{name}-avg"], summed / world), (rank, name)


def _bad_then_usable(rank, world):
    import torch
    import torch.distributed as dist

    import ndist.torch.ops as ops

    t = torch.ones(4)
    dist.all_reduce(t)
    errors = []
    try:
        dist.all_reduce(torch.ones(4), op=dist.ReduceOp.BAND)  # BAND on float32: refused before sending
    except ValueError as err:
        errors.append(str(err))
    try:
        torch.ops.ndist.all_reduce_(torch.ones(4), dist.group.WORLD.group_name, "mean")
    except ValueError as err:
        errors.append(str(err))
    dist.all_reduce(t)
    world = dist.group.WORLD
    return errors, t.tolist(), ops.engine_calls(), (type(world).__name__, world.name())


def test_bad_arguments_raise_and_the_group_stays_usable(compiled, tmp_path):
    for errors, t, calls, group in run_torch(_bad_then_usable, 2, "ndist", tmp_path):
        assert group == ("NdistProcessGroup", "ndist"), group  # (DDP's logging reads the name)
        assert len(errors) == 2, errors
        assert "BAND" in errors[0] and "float32" in errors[0], errors
        assert "op: expected one of 'sum'" in errors[1] and "got 'mean'" in errors[1], errors
        assert t == [4.0] * 4
        assert calls == 1  # the last all_reduce: the first is the Python group's, the refused ones count not


# --------------------------------------------------------------------------------------- DDP
# DDP on the compiled backend, bitwise equal to Gloo: tests/torch_backend/test_ddp.py (the default
# backend), on every torch release.


# --------------------------------------------------------------------------- a peer killed
def _killed_mid_op(rank, size):
    """All-reduces; the last rank dies before step 20's (the others are in it, or about to
    be); a survivor returns what its all_reduce raised."""
    import logging
    import sys

    import torch.distributed as dist

    import ndist.torch.ops as ops

    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    t = torch.ones(1 << 16)
    for step in range(50):
        if rank == size - 1 and step == 20:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            dist.all_reduce(t)
        except Exception as err:
            return {"type": type(err).__module__ + "." + type(err).__qualname__, "msg": str(err),
                    "rank": getattr(err, "rank", None), "calls": ops.engine_calls()}
    return "no error in 50 steps"


def _kill_mid_op(tmp_path, mode):
    res = run_torch_with_victim(_killed_mid_op, 2, "ndist", tmp_path, 1, env={"NDIST_TORCH_COMPILED": mode})
    assert res[-1] is None and isinstance(res[0], dict), res
    return res[0]


def test_a_peer_killed_mid_op_gives_the_python_backends_error(compiled, tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "p").mkdir()
    ours = _kill_mid_op(tmp_path / "c", "1")
    python = _kill_mid_op(tmp_path / "p", "0")
    assert ours["calls"] >= 19 and python["calls"] == -1, (ours, python)
    assert ours["type"] == python["type"] == "torch.distributed.DistNetworkError", (ours, python)
    assert ours["rank"] == python["rank"] == 1, (ours, python)
    assert "rank 1" in ours["msg"], ours


# ----------------------------------------------------------------------- the custom ops
def _custom_ops(rank, world):
    import torch
    import torch.distributed as dist

    import ndist.torch.ops as ops

    name = dist.group.WORLD.group_name
    dist.barrier()  # sets the engine up

    def layer(x, w):  # a tensor-parallel row layer: local matmul, then the all-reduce
        y = x @ w
        torch.ops.ndist.all_reduce_(y, name)
        z = torch.relu(y)
        g = torch.empty(world * z.numel(), dtype=z.dtype)
        torch.ops.ndist.all_gather_into(g, z.reshape(-1), name)
        b = g[: z.numel()].reshape(z.shape).clone()
        torch.ops.ndist.broadcast_(b, 1, name)
        return b + g.reshape(world, *z.shape).sum(0)

    gen = torch.Generator().manual_seed(rank)
    x, w = torch.randn(4, 32, generator=gen), torch.randn(32, 16, generator=gen)
    eager = layer(x, w)
    torch._inductor.config.compile_threads = 1  # no pool of compile workers on a shared machine
    before = ops.engine_calls()
    compiled_layer = torch.compile(layer, fullgraph=True)
    traced = compiled_layer(x, w)
    again = compiled_layer(x, w)
    t = torch.arange(6.0).reshape(2, 3).t()  # not contiguous: the group's own all_reduce, written back
    torch.ops.ndist.all_reduce_(t, name, "max")
    return eager, traced, again, ops.engine_calls() - before, t


def test_custom_ops_under_torch_compile_fullgraph_equal_eager(compiled, tmp_path, monkeypatch):
    # Inductor keeps files under $TMPDIR/torchinductor_<user> beside its cache dir: the test's
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    out = run_torch(_custom_ops, 2, "ndist", tmp_path, timeout=500)
    for rank, (eager, traced, again, calls, t) in enumerate(out):
        assert torch.equal(eager, traced) and torch.equal(eager, again), rank
        assert torch.equal(eager, out[0][0]), rank  # the all-reduce made every rank's equal
        assert calls >= 6, calls  # the compiled graph's ops went through the engine
        assert torch.equal(t, torch.arange(6.0).reshape(2, 3).t()), t
