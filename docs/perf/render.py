"""Render docs/performance.md from docs/perf/performance.md.in and the runs of
docs/perf/reproduce.sh (their .json, .md and .txt files). Run from the repository root:
    python docs/perf/render.py
"""

import json
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "."


def load(n, kind="targets"):
    j = json.load(open(f"{root}/docs/perf/{kind}_n{n}.json"))
    md = open(f"{root}/docs/perf/{kind}_n{n}.md").read()
    txt = open(f"{root}/docs/perf/{kind}_n{n}.txt").read().splitlines()
    head = []
    for line in txt:
        if line.startswith("# Using ranks"):
            break
        head.append(line)
    return j, md, "\n".join(head)


def ratio(j, op, size, pair, what):
    for r in j["ratios"][op]:
        if r["size"] == size and pair in r:
            return r[pair][what]
    return None


M = 1 << 20
runs = {n: load(n) for n in (2, 4)}


def cell(v, ok):
    if v is None:
        return "not measured"
    return f"{v:.2f}x — {'**met**' if ok(v) else '**not met**'}"


rows = []
for op in ("all_reduce", "all_to_all"):
    rows.append((f"{op} busbw at 16 MiB, ndist[socket] / mpi4py+MPICH >= 1.0x",
                 [cell(ratio(runs[n][0], op, 16 * M, "ndist[socket]/mpi4py", "busbw"), lambda v: v >= 1.0) for n in (2, 4)]))
for op in ("all_reduce", "all_to_all"):
    rows.append((f"{op} busbw at 16 MiB, ndist[socket] / torch Gloo >= 4x",
                 [cell(ratio(runs[n][0], op, 16 * M, "ndist[socket]/torch", "busbw"), lambda v: v >= 4.0) for n in (2, 4)]))
lat = {n: load(n, "latency") for n in (2, 4)}
rows.append(("all_reduce time at 4 KiB, ndist[socket] / MPICH <= 3x (500 calls per round)",
             [cell(ratio(lat[n][0], "all_reduce", 4096, "ndist[socket]/mpi4py", "time"), lambda v: v <= 3.0) for n in (2, 4)]))
for op in ("all_reduce", "all_to_all"):
    cells = []
    for n in (2, 4):
        vals = [(s, ratio(runs[n][0], op, s, "ndist[mpi]/mpi4py", "time")) for s in (M, 4 * M, 16 * M, 64 * M)]
        vals = [(s, v) for s, v in vals if v is not None]
        worst = max(vals, key=lambda x: x[1]) if vals else None
        cells.append("not measured" if worst is None else
                     f"worst {worst[1]:.2f}x (at {worst[0] // M} MiB) — {'**met**' if worst[1] <= 1.05 else '**not met**'}")
    rows.append((f"MPI backend overhead, {op}: ndist[mpi] / mpi4py time <= 1.05x at >= 1 MiB", cells))
targets = "| target | 2 ranks | 4 ranks |\n|---|---|---|\n" + "\n".join(f"| {t} | {a} | {b} |" for t, (a, b) in rows)
tmpl = open(f"{root}/docs/perf/performance.md.in").read()
out = tmpl.replace("@TARGETS@", targets)
for n in (2, 4):
    out = out.replace(f"@LHEAD{n}@", lat[n][2]).replace(f"@LMD{n}@", lat[n][1].strip())
    j, md, head = runs[n]
    out = out.replace(f"@THEAD{n}@", head).replace(f"@TMD{n}@", md.strip())
    j, md, head = load(n, "sweep")
    out = out.replace(f"@HEAD{n}@", head).replace(f"@MD{n}@", md.strip())
open(f"{root}/docs/performance.md", "w").write(out)
