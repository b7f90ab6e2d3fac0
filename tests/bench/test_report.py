"""Table layout, footers, ratios and JSON of ndist-bench (formatting only)."""

import json

import pytest

from ndist.bench import Row, RunResult, parse_args
from ndist.bench._report import COLUMNS, format_ratios, format_report, format_table, ratio_rows, to_json

pytestmark = pytest.mark.timeout(30)


def _row(lib, size, time_us, busbw, wrong=0, op="all_reduce"):
    return Row(lib=lib, op=op, size=size, count=size // 4, type="float32", redop="sum", root=-1,
               time_us=time_us, algbw=busbw, busbw=busbw, wrong=wrong, samples_us=[time_us])


def _result(libs_flags, rows):
    cfg = parse_args(["all_reduce", "-b", "8", "-e", "16", *libs_flags])
    return RunResult(config=cfg, rows=rows, ranks={}, versions={}, commands={})


def test_table_columns_and_footer():
    rows = [_row("mpi4py", 8, 5.123, 0.5), _row("mpi4py", 16, 123.45, 1.5), _row("mpi4py", 32, 12345.6, 2.5)]
    text = format_table(rows, "all_reduce -- mpi4py -- nproc 2").splitlines()
    assert text[1] == "# all_reduce -- mpi4py -- nproc 2"
    assert text[2].split()[1:] == list(COLUMNS)
    assert text[3].split()[1:] == ["(B)", "(elements)", "(us)", "(GB/s)", "(GB/s)"]
    data = [line.split() for line in text[4:7]]
    assert data[0] == ["8", "2", "float32", "sum", "-1", "5.12", "0.50", "0.50", "0"]
    assert data[1][5] == "123.5" and data[2][5] == "12346"  # nccl-tests' time precision rules
    assert text[7] == "# Wrong values         : 0 OK"
    assert text[8].split(":")[1].strip() == "1.5"  # mean busbw


def test_wrong_and_unchecked_rows():
    text = format_table([_row("torch", 8, 1.0, 1.0, wrong=3), _row("torch", 16, 1.0, 1.0, wrong=-1)])
    lines = text.splitlines()
    assert lines[2].split()[-1] == "3" and lines[3].split()[-1] == "N/A"
    assert "# Wrong values         : 3 FAILED" in text


def test_ratios_put_ndist_first():
    rows = [_row("ndist[socket]", 8, 10.0, 2.0), _row("mpi4py", 8, 5.0, 4.0), _row("torch", 8, 40.0, 0.5)]
    res = _result(["--compare", "mpi4py,torch"], rows)
    (r,) = ratio_rows(res, "all_reduce")
    assert r["ndist[socket]/mpi4py"] == {"busbw": 0.5, "time": 2.0}
    assert r["ndist[socket]/torch"] == {"busbw": 4.0, "time": 0.25}
    assert "mpi4py/torch" not in r
    text = format_ratios(res, "all_reduce")
    assert "ndist[socket]/mpi4py" in text and text.splitlines()[-1].split() == ["8", "0.500", "2.000", "4.000", "0.250"]


def test_ratios_between_ndist_backends_and_without_ndist():
    rows = [_row("ndist[socket]", 8, 1.0, 1.0), _row("ndist[mpi]", 8, 2.0, 2.0), _row("mpi4py", 8, 4.0, 4.0)]
    res = _result(["--backend", "socket,mpi", "--compare", "mpi4py"], rows)
    (r,) = ratio_rows(res, "all_reduce")
    assert set(r) == {"size", "ndist[socket]/mpi4py", "ndist[mpi]/mpi4py"}
    assert r["ndist[mpi]/mpi4py"]["time"] == 0.5
    res = _result(["--backend", "none", "--compare", "mpi4py,torch"],
                  [_row("mpi4py", 8, 1.0, 3.0), _row("torch", 8, 3.0, 0.0)])
    (r,) = ratio_rows(res, "all_reduce")
    assert r["mpi4py/torch"] == {"busbw": None, "time": pytest.approx(1 / 3)}
    assert "n/a" in format_ratios(res, "all_reduce")


def test_report_and_json():
    rows = [_row("mpi4py", 8, 1.0, 1.0), _row("mpi4py", 16, 1.0, 3.0)]
    res = _result(["--backend", "none", "--compare", "mpi4py"], rows)
    argv = ["ndist-bench", "all_reduce", "-b", "8"]
    text = format_report(res, argv)
    assert text.startswith("# ndist-bench all_reduce  minBytes 8 maxBytes 16")
    assert "# command: ndist-bench all_reduce -b 8" in text and "# host: " in text
    assert "Ratios" not in text  # one library: nothing to compare
    doc = json.loads(to_json(res, argv))
    assert doc["avg_busbw"] == {"all_reduce": {"mpi4py": 2.0}}
    assert [r["size"] for r in doc["results"]] == [8, 16]
    assert doc["config"]["compare"] == ["mpi4py"]


def test_markdown_side_by_side():
    from ndist.bench._markdown import format_markdown

    rows = [_row("ndist[socket]", 4096, 10.0, 2.0), _row("mpi4py", 4096, 5.0, 4.0),
            _row("ndist[socket]", 16 << 20, 1000.0, 8.0), _row("mpi4py", 16 << 20, 2000.0, 4.0)]
    res = _result(["--compare", "mpi4py"], rows)
    lines = format_markdown(res).splitlines()
    assert lines[0] == "**all_reduce**, 2 ranks, float32, sum"
    head = [c.strip() for c in lines[2].strip("|").split("|")]
    assert head == ["size", "ndist[socket] time (us)", "mpi4py time (us)", "ndist[socket] busbw (GB/s)",
                    "mpi4py busbw (GB/s)"]
    assert [c.strip() for c in lines[4].strip("|").split("|")] == ["4 KiB", "10.0", "5.0", "2.000", "4.000"]
    ratio_head = [c.strip() for c in lines[7].strip("|").split("|")]
    assert ratio_head == ["size", "ndist[socket]/mpi4py busbw", "ndist[socket]/mpi4py time"]
    assert lines[9] == "| 4 KiB | 0.50 | 2.00 |" and lines[10] == "| 16 MiB | 2.00 | 0.50 |"
    assert "Wrong elements: 0" in lines


def test_header_reports_load():
    res = _result(["--backend", "none", "--compare", "mpi4py"], [_row("mpi4py", 8, 1.0, 1.0)])
    res.load = ((1.5, 1.0, 0.5), (2.0, 1.25, 0.75))
    text = format_report(res, ["ndist-bench"])
    assert "# load average (1/5/15 min): 1.50/1.00/0.50 at start, 2.00/1.25/0.75 at end" in text
    doc = json.loads(to_json(res, ["ndist-bench"]))
    assert doc["machine"]["load_start"] == [1.5, 1.0, 0.5]


def test_round_spread_names_the_cells_with_a_round_above_twice_the_median():
    def row(lib, size, samples):
        r = _row(lib, size, sorted(samples)[len(samples) // 2], 1.0)
        r.samples_us = list(samples)
        return r

    rows = [row("ndist[socket]", 8, [5.0, 5.2, 11.0, 4.9, 5.1]),  # round 2: 2.16x the median 5.1
            row("ndist[socket]", 16, [10.0, 19.9, 10.2, 10.1, 9.9]),  # 1.97x: not counted
            row("mpi4py", 8, [6.0, 6.1, 6.2, 6.0, 30.0]), row("mpi4py", 16, [7.0, 7.0, 7.1, 7.0, 7.0])]
    text = format_report(_result(["--compare", "mpi4py"], rows))
    spread = text[text.index("# Round spread"):].splitlines()
    assert spread[1].split() == ["#", "ndist[socket]", "1", "of", "2", "cells;", "worst", "round", "2.2x",
                                 "(all_reduce", "8", "B)"]
    assert spread[2] == "#    all_reduce 8 B, median 5.10 us: round 2 11.00 us"
    assert spread[3].split()[1:5] == ["mpi4py", "1", "of", "2"] and "round 4 30.00 us" in spread[4]
    # one round per cell: nothing to compare, no footer
    assert "Round spread" not in format_report(_result(["--compare", "mpi4py"], [_row("mpi4py", 8, 1.0, 1.0)]))
