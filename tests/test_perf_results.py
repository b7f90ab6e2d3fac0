"""docs/performance.md's results section cannot drift from its data (the checks every
rendered page has are in test_rendered_pages.py).

The section between the markers is what ``docs/perf/render.py`` makes of the committed
``docs/perf/results/*.json``, and each of those files is what ``docs/perf/collect.py`` makes
of the raw text output it names (the GPU's file is entered by hand and has no raw output).
"""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.docs_scripts import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PERF = os.path.join(ROOT, "docs", "perf")


render = load_script(os.path.join("docs", "perf"), "render")
collect = load_script(os.path.join("docs", "perf"), "collect")


def test_a_page_without_the_markers_is_refused():
    with pytest.raises(ValueError, match="markers"):
        render.splice("# Performance\n", "x\n")


@pytest.mark.parametrize("kind", ["one_host", "across_hosts", "torch", "deepspeed"])
def test_each_results_file_is_its_raw_output_collected(kind):
    with open(os.path.join(PERF, "results", f"{kind}.json"), encoding="utf-8") as f:
        committed = json.load(f)
    sources = [os.path.join(ROOT, run["source"]) for run in committed["runs"]]
    again = collect.collect(kind, sources, date=committed["date"], time=committed["time_utc"],
                            commit=committed["commit"], conditions=committed["conditions"])
    assert again == committed


def test_collect_refuses_a_run_with_wrong_elements(tmp_path):
    with open(os.path.join(PERF, "s11_n2.txt"), encoding="utf-8") as f:
        text = f.read()
    row = "        4096          1024   float32     sum      -1       8.80     0.47     0.47       0"
    assert row in text
    bad = tmp_path / "bad.txt"
    bad.write_text(text.replace(row, row[:-1] + "3", 1))
    with pytest.raises(ValueError, match="3 wrong elements"):
        collect.collect("one_host", [str(bad)], date="2026-01-01", time="00:00", commit="x",
                        conditions="test")


def test_the_committed_headers_keep_no_output_paths():
    for name in os.listdir(os.path.join(PERF, "results")):
        with open(os.path.join(PERF, "results", name), encoding="utf-8") as f:
            text = f.read()
        assert not re.search(r"--(json|markdown|plot) \S|/work/|/home/|/root/", text), name


def _torch_ds_output(nproc: int, times: dict) -> str:
    """ndist-bench -q's output for all_reduce with the libraries of ``times`` ({lib: {size: us}})."""
    lines = ["# ndist-bench: all_reduce", f"# command: ndist-bench all_reduce --nproc {nproc}",
             f"# nproc: {nproc} per library  datatype: float32  redop: sum"]
    for lib, by_size in times.items():
        lines.append(f"# all_reduce -- {lib} -- nproc {nproc}")
        for size, us in by_size.items():
            lines.append(f"{size:>12} {size // 4:>13}   float32     sum      -1 {us:>10.2f}     1.00     1.00       0")
        lines.append("# Wrong values         : 0 OK")
    return "\n".join(lines) + "\n"


def test_the_torch_and_deepspeed_table_renders_from_its_results(tmp_path):
    """torch_deepspeed.json (collect.py from `ndist-bench --compare torch:ndist,torch:ndist-op,deepspeed`)
    fills the table and the two targets; without it the page says "not measured yet"."""
    results = tmp_path / "results"
    results.mkdir()
    for name in os.listdir(os.path.join(PERF, "results")):
        if name != "torch_deepspeed.json":
            (results / name).write_text(open(os.path.join(PERF, "results", name), encoding="utf-8").read())
    assert "not measured yet" in render.render(str(results))
    runs = []
    for nproc, slow in ((2, 1.0), (4, 1.5)):
        path = tmp_path / f"n{nproc}.txt"
        path.write_text(_torch_ds_output(nproc, {
            "ndist[socket]": {4096: 2.0, 16 << 20: 1000.0}, "torch:ndist": {4096: 2.2 * slow, 16 << 20: 1100.0},
            "torch:ndist-op": {4096: 2.1, 16 << 20: 1000.0}, "deepspeed": {4096: 3.5, 16 << 20: 1300.0}}))
        runs.append(str(path))
    data = collect.collect("torch_deepspeed", runs, date="2026-01-01", time="00:00-00:10", commit="abc",
                           conditions="a test")
    (results / "torch_deepspeed.json").write_text(json.dumps(data))
    text = render.render(str(results))
    assert "| custom op / DeepSpeed | 0.60 | 0.77 |" in text, text
    assert "| torch on \"ndist\" / ndist | 1.10 | 1.10 |" in text and "| torch on \"ndist\" / ndist | 1.65 | 1.10 |" in text
    assert "compiled backend, ≤ 1.2x ndist's own API from 4 KiB, 2 and 4 ranks | **not met**; above: 4 ranks 4K 1.65x |" in text
    assert "`inference_all_reduce`, 4 KiB–16 MiB, 2 and 4 ranks | **met**; above: none |" in text
