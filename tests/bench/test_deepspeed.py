"""ndist-bench's ``deepspeed`` comparator: DeepSpeed's shared-memory all_reduce (its CPU
tensor-parallel path, ``deepspeed.comm.inference_all_reduce``). Real tiny sweeps where
DeepSpeed is installed (nothing about speed); what it does not offer is printed as absent;
without DeepSpeed, asking for it is a usage error."""

import importlib.util
import json
import os

import pytest

from ndist.bench import Row, RunResult, main, parse_args, run_bench
from ndist.bench._adapters import DeepSpeedAdapter, not_offered
from ndist.bench._launch import RankGroup
from ndist.bench._markdown import format_markdown
from ndist.bench._report import format_report, to_json
from tests.bench.bench_output import table

HAVE_DEEPSPEED = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("deepspeed") is not None
needs_deepspeed = pytest.mark.skipif(not HAVE_DEEPSPEED, reason="deepspeed (and torch) not installed")
_SEGMENT = "deepspeed_allreduce_buffer_"


def _segments() -> set:
    return {n for n in os.listdir("/dev/shm") if n.startswith(_SEGMENT)}


def test_compare_accepts_deepspeed():
    cfg = parse_args(["all_reduce", "--backend", "none", "--compare", "mpi4py,torch,deepspeed"])
    assert cfg.libraries == ("mpi4py", "torch", "deepspeed")


def test_deepspeed_offers_all_reduce_sum_on_float_types_only():
    for dtype in ("float32", "float16", "bfloat16"):
        assert not_offered("deepspeed", "all_reduce", dtype, "sum") is None
    assert "no all_to_all" in not_offered("deepspeed", "all_to_all", "float32", "sum")
    assert "Gloo" in not_offered("deepspeed", "broadcast", "float32", "sum")  # says where deepspeed.comm sends it
    assert "ignores op=max" in not_offered("deepspeed", "all_reduce", "float32", "max")
    assert "int32 is returned unreduced" in not_offered("deepspeed", "all_reduce", "int32", "sum")
    # the other libraries offer every op
    for lib in ("mpi4py", "torch", "torch:ndist", "ndist[socket]", "ndist[mpi]"):
        assert not_offered(lib, "all_to_all", "int32", "max") is None


def _row(lib, op, size, time_us):
    return Row(lib=lib, op=op, size=size, count=size // 4, type="float32", redop="sum", root=-1,
               time_us=time_us, algbw=1.0, busbw=1.0, wrong=0, samples_us=[time_us])


def test_an_op_not_offered_is_printed_as_absent_in_every_output():
    cfg = parse_args(["all_reduce", "all_gather", "-b", "64", "-e", "64", "--backend", "none",
                      "--compare", "torch,deepspeed"])
    why = not_offered("deepspeed", "all_gather", "float32", "sum")
    rows = [_row("torch", "all_reduce", 64, 50.0), _row("deepspeed", "all_reduce", 64, 10.0),
            _row("torch", "all_gather", 64, 40.0)]
    res = RunResult(config=cfg, rows=rows, ranks={}, versions={"torch": {}, "deepspeed": {}}, commands={},
                    absent={"deepspeed": {"all_gather": why}})
    out = format_report(res, ["ndist-bench"])
    assert f"# all_gather -- deepspeed -- nproc 2\n# not offered: {why}\n" in out
    assert [r[0] for r in table(out, "deepspeed", "all_reduce")] == ["64"]
    assert "torch/deepspeed" in out  # all_reduce's ratios
    doc = json.loads(to_json(res, ["ndist-bench"]))
    assert doc["absent"] == {"deepspeed": {"all_gather": why}}
    assert set(doc["avg_busbw"]["all_gather"]) == {"torch"}
    assert set(doc["avg_busbw"]["all_reduce"]) == {"torch", "deepspeed"}
    md = format_markdown(res)
    gather = md[md.index("**all_gather**"):]
    assert f"Not offered by deepspeed: {why}." in gather
    assert "deepspeed time (us)" not in gather and "torch time (us)" in gather
    assert "deepspeed time (us)" in md[:md.index("**all_gather**")]


@pytest.mark.timeout(60)
@pytest.mark.skipif(HAVE_DEEPSPEED, reason="deepspeed is installed here")
def test_missing_deepspeed_is_a_usage_error(capsys):
    assert main(["all_reduce", "-b", "8", "-e", "8", "--backend", "none", "--compare", "deepspeed"]) == 2
    err = capsys.readouterr().err
    assert "deepspeed" in err and "not installed" in err and "--compare" in err


@pytest.mark.torch
@needs_deepspeed
@pytest.mark.timeout(600)  # the first run compiles DeepSpeed's shm op (minutes on 2 cores)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_tiny_sweep_through_deepspeed_checks_out_and_other_ops_are_absent(dtype, capsys):
    before = _segments()
    rc = main(["all_reduce", "all_to_all", "-b", "8", "-e", "8M", "-f", "16", "-n", "2", "-w", "1", "--nproc", "2",
               "-d", dtype, "-q", "--backend", "none", "--compare", "deepspeed"])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = table(out, "deepspeed", "all_reduce")
    # 8 B .. 8 MiB: both of DeepSpeed's algorithms (below and above its 1 MiB threshold)
    assert [int(r[0]) for r in rows] == [8, 128, 2048, 32768, 524288, 8388608]
    assert all(r[2] == dtype and r[-1] == "0" for r in rows), rows  # every result checked and right
    assert "# all_to_all -- deepspeed -- nproc 2\n# not offered: DeepSpeed's shared-memory path has no all_to_all" in out
    assert "deepspeed 0." in out and "torch 2." in out  # versions in the header
    assert _segments() <= before  # its /dev/shm segments are gone


@pytest.mark.torch
@needs_deepspeed
@pytest.mark.timeout(600)
def test_deepspeed_maps_its_segments_unlinked_and_the_launcher_removes_leftovers():
    """While the group is up, each rank maps every rank's segment (the shm op is on) and none
    is left in /dev/shm; a segment a killed rank left is removed by ``kill``."""
    g = RankGroup("deepspeed", 3, timeout=600).start()
    try:
        res = g.run({"op": "all_reduce", "nbytes": 4096, "dtype": "float32", "redop": "sum", "root": 0,
                     "iters": 2, "warmup": 1, "check": 1})
        assert [r["wrong"] for r in res] == [0, 0, 0]
        for info in g.ranks.values():
            with open(f"/proc/{info['pid']}/maps") as f:
                mapped = {line.split()[-2] for line in f if _SEGMENT in line and line.rstrip().endswith("(deleted)")}
            assert mapped == {DeepSpeedAdapter.segment(r, g.tag) for r in range(3)}, mapped
        assert not [p for p in DeepSpeedAdapter.leftovers(3, g.tag) if os.path.exists(p)]
        # as if rank 1 had been killed before it unlinked its segment
        with open(DeepSpeedAdapter.segment(1, g.tag), "wb") as f:
            f.write(b"\0" * 64)
    finally:
        g.kill()
    assert not [p for p in DeepSpeedAdapter.leftovers(3, g.tag) if os.path.exists(p)]


@pytest.mark.torch
@needs_deepspeed
@pytest.mark.timeout(60)
def test_deepspeed_with_nothing_to_run_is_not_started():
    res = run_bench(parse_args("all_reduce broadcast -b 8 -e 8 -n 1 -w 0 -o max --nproc 2 --backend none "
                               "--compare deepspeed".split()))
    assert res.rows == [] and res.ranks == {}
    assert set(res.absent["deepspeed"]) == {"all_reduce", "broadcast"}
    assert "not started" in format_report(res, ["ndist-bench"])
