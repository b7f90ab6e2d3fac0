"""ndist-bench --plot: checked before anything runs; a latency panel (log-log) and a busbw
panel (log y) per op, read back from the matplotlib figure, not from pixels."""

import os
import subprocess
import sys
import textwrap

import pytest

from ndist.bench import Row, RunResult, parse_args
from tests.fresh_python import without

pytestmark = pytest.mark.timeout(120)

HIDE_MATPLOTLIB = without("matplotlib")


def test_plot_without_matplotlib_is_refused_before_any_rank_starts(tmp_path):
    png = tmp_path / "out.png"
    code = HIDE_MATPLOTLIB + textwrap.dedent(f"""
        from ndist.bench import main
        sys.exit(main(["all_reduce", "-b", "8", "-e", "8", "-n", "1", "-w", "0", "--nproc", "2",
                       "--plot", {str(png)!r}]))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "pip install 'ndist[bench]'" in r.stderr and "matplotlib" in r.stderr
    assert "# all_reduce" not in r.stderr and r.stdout == ""  # no progress line, no table: nothing ran
    assert not png.exists()


def test_output_directory_that_does_not_exist_is_refused_before_running(tmp_path, capsys):
    from ndist.bench import main

    for flag in ("--plot", "--json", "--markdown"):
        path = str(tmp_path / "missing" / "out")
        assert main(["all_reduce", "-b", "8", "-e", "8", "-n", "1", "-w", "0", flag, path]) == 2
        err = capsys.readouterr().err
        assert flag.lstrip("-") in err and "does not exist" in err and "# all_reduce" not in err


def _row(lib, op, size, time_us, busbw):
    return Row(lib=lib, op=op, size=size, count=size // 4, type="float32", redop="sum", root=-1,
               time_us=time_us, algbw=busbw, busbw=busbw, wrong=0, samples_us=[time_us])


def _result(ops=("all_reduce", "all_to_all"), nproc="2"):
    cfg = parse_args([*ops, "-b", "4K", "-e", "16M", "-f", "4", "--nproc", nproc, "--compare", "mpi4py"])
    rows = []
    for op in cfg.ops:
        for lib, speed in (("ndist[socket]", 1.0), ("mpi4py", 2.0)):
            for size in cfg.sizes:
                time_us = 5.0 / speed + size / (speed * 4e3)
                busbw = 0.0 if cfg.nproc == 1 or op == "barrier" else size / time_us / 1e3
                rows.append(_row(lib, op, 0 if op == "barrier" else size, time_us, busbw))
    return RunResult(config=cfg, rows=rows, ranks={}, versions={}, commands={})


def test_each_op_has_a_log_log_latency_panel_and_a_log_busbw_panel():
    pytest.importorskip("matplotlib")
    from ndist.bench._plot import figure

    res = _result()
    fig = figure(res)
    axes = fig.get_axes()
    assert len(axes) == 4  # (latency, busbw) per op
    for i, op in enumerate(("all_reduce", "all_to_all")):
        lat, bw = axes[2 * i], axes[2 * i + 1]
        assert (lat.get_xscale(), lat.get_yscale()) == ("log", "log")
        assert (bw.get_xscale(), bw.get_yscale()) == ("log", "log")  # small sizes no longer sit on 0
        assert "time" in lat.get_ylabel() and "us" in lat.get_ylabel()
        assert "busbw" in bw.get_ylabel()
        assert op in lat.get_title() and op in bw.get_title()
        for ax, field in ((lat, "time_us"), (bw, "busbw")):
            lines = {ln.get_label(): ln for ln in ax.get_lines()}
            assert set(lines) == {"ndist[socket]", "mpi4py"}
            for lib, ln in lines.items():
                rows = res.rows_for(lib, op)
                assert list(ln.get_xdata()) == [r.size for r in rows]
                assert list(ln.get_ydata()) == pytest.approx([getattr(r, field) for r in rows])
        assert [lat.xaxis.get_major_formatter()(v) for v in (4096, 1 << 20, 64 << 20)] == ["4K", "1M", "64M"]
        # The y range spans the smallest value: the 4 KiB point is above the axis' bottom.
        ymin, _ = bw.get_ylim()
        assert 0 < ymin <= min(r.busbw for r in res.rows if r.op == op)


def test_one_rank_has_no_busbw_and_barrier_only_latency(tmp_path):
    pytest.importorskip("matplotlib")
    from ndist.bench._plot import figure, plot

    fig = figure(_result(ops=("all_reduce",), nproc="1"))  # busbw is 0 for every size on 1 rank
    lat, bw = fig.get_axes()
    assert lat.get_yscale() == "log" and not bw.get_lines()
    assert "no bus traffic" in " ".join(t.get_text() for t in bw.texts)
    res = _result(ops=("barrier", "all_reduce"))
    assert len(figure(res).get_axes()) == 2  # barrier moves no bytes (size 0): not plotted
    out = tmp_path / "p.png"
    plot(res, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_of_barrier_only_is_refused_before_running(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from ndist.bench import main

    assert main(["barrier", "-n", "1", "-w", "0", "--plot", str(tmp_path / "b.png")]) == 2
    err = capsys.readouterr().err
    assert "barrier moves no bytes" in err and "# barrier" not in err
