"""Turn the text output of a benchmark run into a results file that docs/performance.md is
generated from (``docs/perf/render.py``).

    python docs/perf/collect.py one_host --date 2026-11-28 --time 12:34-12:42 --commit 38c5a74 \\
        --conditions "nothing else on the machine" docs/perf/s11_n2.txt docs/perf/s11_n4.txt

KIND is ``one_host``, ``across_hosts``, ``torch``, ``deepspeed`` or ``torch_deepspeed``; the
files are what ``ndist-bench -q`` (all but the second) or ``benchmarks/multihost.py --compare``
(the second) printed. ``torch_deepspeed`` takes one run per rank count of
``ndist-bench all_reduce -b 4K -e 16M -f 4 --rounds 5 -q --compare torch:ndist,torch:ndist-op,deepspeed``
(ndist's own API, torch on "ndist" with its compiled backend, ndist's custom op and
DeepSpeed's ``inference_all_reduce``, interleaved). The output is ``docs/perf/results/KIND.json``: per run, the header
lines that describe it and every library's µs per call by op and size, plus the date, time,
commit and conditions given here (the text output does not know them). The raw text stays
under docs/perf/ as well, and ``docs/perf/README.md`` indexes it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
KINDS = ("one_host", "across_hosts", "torch", "deepspeed", "torch_deepspeed")
TITLES = {
    "one_host": "One host: ndist against MPICH and Gloo",
    "across_hosts": "Across hosts (network namespaces): ndist against MPICH and Gloo",
    "torch": "Through torch: torch.distributed on backend \"ndist\" against Gloo",
    "deepspeed": "DeepSpeed's shared-memory all_reduce",
    "torch_deepspeed": "torch on \"ndist\" (compiled) and ndist's custom op against DeepSpeed's inference_all_reduce",
}
# the header lines worth keeping: how the run was made and on what, not the ranks' process ids
_KEEP = ("# ndist-bench", "# command:", "# host:", "# nproc:", "# load average", "# multihost",
         "# 20 calls", "#  ")
_BENCH_BLOCK = re.compile(r"^# (\w+) -- (\S+) -- nproc (\d+)$")
_MH_BLOCK = re.compile(r"^# (\w+)$")
_MH_LIBS = {"ndist": "ndist[socket]", "MPICH": "mpi4py", "Gloo": "torch"}


def _header(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        if line.startswith("# Using ranks"):
            break
        if line.startswith(_KEEP):   # output paths name the machine that ran it: not kept
            out.append(re.sub(r" --(json|markdown|plot) \S+", "", line[2:].rstrip()))
    return out


def parse_bench(text: str) -> dict:
    """``ndist-bench -q`` output: ``{"nproc", "header", "times_us": {op: {size: {lib: us}}}}``."""
    lines = text.splitlines()
    times: dict = {}
    nproc = None
    op = lib = None
    for line in lines:
        m = _BENCH_BLOCK.match(line)
        if m:
            op, lib, nproc = m.group(1), m.group(2), int(m.group(3))
            continue
        if line.startswith("#"):
            if line.startswith(("# Ratios", "# Wrong")):
                lib = None
            continue
        if lib is None or not line.strip():
            continue
        fields = line.split()
        if fields[-1] == "offered":         # "not offered": the library has no call for the op
            continue
        size, us, wrong = fields[0], float(fields[5]), int(fields[-1])
        if wrong:
            raise ValueError(f"{op} {lib} {size}: {wrong} wrong elements; not a result to publish")
        times.setdefault(op, {}).setdefault(size, {})[lib] = us
    if not times:
        raise ValueError("no ndist-bench result blocks found")
    return {"nproc": nproc, "header": _header(lines), "times_us": times}


def parse_multihost(text: str) -> dict:
    """``benchmarks/multihost.py --compare`` output, with the same shape as :func:`parse_bench`
    and ``hosts`` / ``per_host`` from its first line."""
    lines = text.splitlines()
    m = re.match(r"^# multihost --compare: (\d+) hosts x (\d+) ranks", lines[0])
    if not m:
        raise ValueError(f"not multihost.py --compare output: {lines[0]!r}")
    hosts, per_host = int(m.group(1)), int(m.group(2))
    times: dict = {}
    op = None
    libs: list[str] = []
    for line in lines[1:]:
        b = _MH_BLOCK.match(line)
        if b and b.group(1) not in ("checked",):
            op = b.group(1)
            continue
        if line.startswith("#      bytes"):
            libs = [_MH_LIBS[c] for c in line[1:].split() if c in _MH_LIBS]
            continue
        if line.startswith("#") or op is None or not line.strip():
            continue
        fields = line.split()
        wrong = int(fields[-1])
        if wrong:
            raise ValueError(f"{op} {fields[0]}: {wrong} wrong elements; not a result to publish")
        for lib, value in zip(libs, fields[1:1 + len(libs)]):
            times.setdefault(op, {}).setdefault(fields[0], {})[lib] = float(value)
    return {"hosts": hosts, "per_host": per_host, "nproc": hosts * per_host,
            "header": _header(lines), "times_us": times}


def collect(kind: str, paths: list[str], *, date: str, time: str, commit: str,
            conditions: str) -> dict:
    parse = parse_multihost if kind == "across_hosts" else parse_bench
    runs = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            run = parse(f.read())
        run["source"] = os.path.relpath(os.path.abspath(path), os.path.dirname(os.path.dirname(HERE)))
        runs.append(run)
    return {"kind": kind, "title": TITLES[kind], "date": date, "time_utc": time, "commit": commit,
            "conditions": conditions, "runs": runs}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("kind", choices=KINDS)
    p.add_argument("files", nargs="+", help="the runs' text output, in the order to show them")
    p.add_argument("--date", required=True, help="UTC date of the run, YYYY-MM-DD")
    p.add_argument("--time", required=True, help="UTC time span of the run, HH:MM-HH:MM")
    p.add_argument("--commit", required=True, help="the commit the run measured")
    p.add_argument("--conditions", required=True, help="what else ran on the machine, the load")
    p.add_argument("--out", default=None, help="default: docs/perf/results/KIND.json")
    a = p.parse_args(argv)
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", a.date):
        p.error(f"--date: expected YYYY-MM-DD, got {a.date!r}")
    data = collect(a.kind, a.files, date=a.date, time=a.time, commit=a.commit,
                   conditions=a.conditions)
    out = a.out or os.path.join(RESULTS, f"{a.kind}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, ensure_ascii=False)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
