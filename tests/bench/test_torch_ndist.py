"""ndist-bench's ``torch:ndist`` comparator: torch.distributed on backend "ndist",
beside ``torch`` (Gloo). A real tiny sweep (nothing about speed) and the ratios."""

import importlib.util

import pytest

from ndist.bench import Row, RunResult, main, parse_args
from ndist.bench._report import ratio_rows
from tests.bench.bench_output import table

HAVE_TORCH = importlib.util.find_spec("torch") is not None


@pytest.mark.torch
@pytest.mark.timeout(240)
@pytest.mark.skipif(not HAVE_TORCH, reason="torch not installed")
@pytest.mark.parametrize("op", ["all_reduce", "all_to_all", "all_gather", "reduce_scatter"])
def test_tiny_sweep_through_torch_on_ndist_checks_out(op, capsys):
    rc = main([op, "-b", "1K", "-e", "4K", "-n", "2", "-w", "1", "--nproc", "2", "-q",
               "--backend", "none", "--compare", "torch:ndist"])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = table(out, "torch:ndist", op)
    assert [int(r[0]) for r in rows] == [1024, 2048, 4096]
    assert all(r[-1] == "0" for r in rows), rows  # every result checked and right
    assert "#  torch:ndist" in out and "torch 2." in out and "ndist " in out  # versions in the header


@pytest.mark.torch
@pytest.mark.timeout(300)
@pytest.mark.skipif(not HAVE_TORCH, reason="torch not installed")
def test_the_python_backend_and_the_custom_op_as_columns(capsys, torch_compiled_build):
    """``torch:ndist-python`` (backend "ndist" on its Python backend) and ``torch:ndist-op``
    (``torch.ops.ndist.all_reduce_``) beside ``torch:ndist`` (its compiled backend): each
    checked, each header saying which backend ran."""
    rc = main(["all_reduce", "-b", "1K", "-e", "2K", "-n", "2", "-w", "1", "--nproc", "2", "-q", "--backend", "none",
               "--compare", "torch:ndist,torch:ndist-python,torch:ndist-op"])
    out = capsys.readouterr().out
    assert rc == 0, out
    for lib in ("torch:ndist", "torch:ndist-python", "torch:ndist-op"):
        rows = table(out, lib, "all_reduce")
        assert [int(r[0]) for r in rows] == [1024, 2048] and all(r[-1] == "0" for r in rows), (lib, rows)
    header = {}
    for line in out.splitlines():  # (the Libraries lines come before the Using ranks ones)
        if line.startswith("#  torch:ndist"):
            header.setdefault(line.split()[1], line)
    assert "torch backend compiled" in header["torch:ndist"] and "compiled" in header["torch:ndist-op"], header
    assert "torch backend python" in header["torch:ndist-python"], header


def test_the_custom_op_is_compared_with_deepspeed():
    cfg = parse_args(["all_reduce", "-b", "8", "-e", "8", "--backend", "none", "--compare",
                      "torch:ndist,torch:ndist-op,deepspeed"])
    rows = [_row("torch:ndist", 8, 6.0, 1.0), _row("torch:ndist-op", 8, 3.0, 2.0), _row("deepspeed", 8, 4.0, 1.5)]
    (r,) = ratio_rows(RunResult(config=cfg, rows=rows, ranks={}, versions={}, commands={}), "all_reduce")
    assert r["torch:ndist-op/deepspeed"]["time"] == pytest.approx(0.75)
    assert r["torch:ndist-op/torch:ndist"]["time"] == pytest.approx(0.5)
    assert r["torch:ndist/deepspeed"]["time"] == pytest.approx(1.5)


def _row(lib, size, time_us, busbw):
    return Row(lib=lib, op="all_reduce", size=size, count=size // 4, type="float32", redop="sum", root=-1,
               time_us=time_us, algbw=busbw, busbw=busbw, wrong=0, samples_us=[time_us])


def test_ratios_compare_torch_on_ndist_with_gloo_and_ndist_with_torch_on_ndist():
    cfg = parse_args(["all_reduce", "-b", "8", "-e", "8", "--compare", "torch,torch:ndist"])
    assert cfg.libraries == ("ndist[socket]", "torch", "torch:ndist")
    rows = [_row("ndist[socket]", 8, 9.0, 2.0), _row("torch", 8, 40.0, 0.5), _row("torch:ndist", 8, 10.0, 1.8)]
    (r,) = ratio_rows(RunResult(config=cfg, rows=rows, ranks={}, versions={}, commands={}), "all_reduce")
    assert set(r) == {"size", "ndist[socket]/torch", "ndist[socket]/torch:ndist", "torch:ndist/torch"}
    assert r["torch:ndist/torch"] == {"busbw": pytest.approx(3.6), "time": 0.25}
    assert r["ndist[socket]/torch:ndist"]["time"] == pytest.approx(0.9)  # torch's layer: 10 % here


def test_compare_accepts_torch_ndist_and_rejects_unknown_backends():
    assert parse_args(["all_reduce", "--backend", "none", "--compare", "torch:ndist"]).libraries == ("torch:ndist",)
    with pytest.raises(SystemExit):
        parse_args(["all_reduce", "--compare", "torch:nccl"])
