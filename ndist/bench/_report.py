"""Text tables in nccl-tests' layout, ratios between libraries, and JSON."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shlex
import socket
import statistics
import sys

from ._launch import bound_like_ndistrun
from ._runner import Row, RunResult

__all__ = ["machine_info", "format_header", "format_table", "format_absent", "format_ratios", "ratio_rows",
           "format_spread", "spread_rows",
           "format_report", "to_json", "COLUMNS"]

COLUMNS = ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong")
_UNITS = ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "")
_FMT = "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}  {:>9}  {:>7}  {:>7}  {:>6}"


def machine_info() -> dict:
    """Host, cores and interpreter, for the header and the JSON."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"host": socket.gethostname(), "cpu": cpu, "cores": os.cpu_count(), "usable_cores": usable,
            "os": platform.platform(), "python": platform.python_version()}


def _fmt_time(us: float) -> str:
    # nccl-tests: 2 decimals below 100 us, 1 below 10 ms, none above
    if us >= 10000.0:
        return f"{us:.0f}"
    if us >= 100.0:
        return f"{us:.1f}"
    return f"{us:.2f}"


def _load(t) -> str:
    return "/".join(f"{x:.2f}" for x in t) if t else "n/a"


def _binding(res: RunResult) -> str:
    """How ndist's ranks (``bound_like_ndistrun``) were placed: ``--bind-to core`` (each on CPUs
    of its own), ``core:overload-allowed`` (one CPU each, CPUs shared) or ``none``."""
    own = [lib for lib in res.config.libraries if bound_like_ndistrun(lib)]
    cpus = [info.get("cpus") for lib in own for info in res.ranks.get(lib, {}).values()]
    if not cpus:
        return ""
    # every library's ranks get the same plan: look at each library's block of ranks
    per_lib = len(cpus) // len(own)
    blocks = [cpus[k:k + per_lib] for k in range(0, len(cpus), per_lib)]
    known = per_lib > 1 and all(c is not None for c in cpus)
    own_cpus = known and all(len({x for c in b for x in c}) == sum(len(c) for c in b) for b in blocks)
    shared = known and not own_cpus and all(
        all(len(c) == 1 for c in b) and len({x for c in b for x in c}) < len(b) for b in blocks)
    if own_cpus:
        return "  ndist's ranks: --bind-to core (CPUs of their own)"
    if shared:
        return "  ndist's ranks: --bind-to core:overload-allowed (one CPU each, shared evenly)"
    return "  ndist's ranks: --bind-to none (unbound)"


def format_header(res: RunResult, argv: list[str] | None = None) -> str:
    cfg, m = res.config, machine_info()
    argv = sys.argv if argv is None else argv
    lines = [
        f"# ndist-bench {' '.join(cfg.ops)}  minBytes {min(cfg.sizes)} maxBytes {max(cfg.sizes)} "
        f"sizes: {len(cfg.sizes)}  warmup iters: {cfg.warmup} iters: {cfg.iters} rounds: {cfg.rounds} ({cfg.stat}) "
        f"validation: {cfg.check}",
        f"# command: ndist-bench {shlex.join(argv[1:])}",
        f"# host: {m['host']}  cpu: {m['cpu']}  cores: {m['cores']} (usable {m['usable_cores']})  "
        f"os: {m['os']}  python: {m['python']}",
        f"# nproc: {cfg.nproc} per library  datatype: {cfg.dtype}  redop: {cfg.redop}{_binding(res)}",
        f"# load average (1/5/15 min): {_load(res.load[0])} at start, {_load(res.load[1])} at end "
        f"(other work on the machine skews absolute numbers; read the ratios)",
        "#",
        "# Libraries",
    ]
    for lib in cfg.libraries:
        v = res.versions.get(lib, {})
        vs = "  ".join(f"{k} {val}" for k, val in v.items())
        if lib not in res.versions and all(res.why_absent(lib, op) for op in cfg.ops):
            vs = "not started: it offers none of these ops with this datatype and redop"
        lines.append(f"#  {lib:<13} {vs}")
        cmd = res.commands.get(lib)
        if cmd and os.path.basename(cmd[0]).startswith("mpiexec"):
            lines.append(f"#  {'':<13} launched with {os.path.basename(cmd[0])} -n {cfg.nproc}")
    lines.append("#")
    lines.append("# Using ranks")
    for lib in cfg.libraries:
        for rank, info in sorted(res.ranks.get(lib, {}).items()):
            cpus = info.get("cpus")
            on = f" CPUs {','.join(map(str, cpus))}" if cpus else ""
            lines.append(f"#  {lib:<13} Rank {rank:2d} Pid {info['pid']:7d} on {info['host']}{on}")
    return "\n".join(lines)


def format_table(rows: list[Row], title: str = "") -> str:
    """One nccl-tests-shaped table with its footer."""
    out = []
    if title:
        out.append(f"#\n# {title}")
    out.append("# " + _FMT.format(*COLUMNS)[2:])
    out.append("# " + _FMT.format(*_UNITS)[2:])
    for r in rows:
        out.append(_FMT.format(r.size, r.count, r.type, r.redop, r.root, _fmt_time(r.time_us),
                               f"{r.algbw:.2f}", f"{r.busbw:.2f}", "N/A" if r.wrong < 0 else r.wrong))
    wrong = sum(max(r.wrong, 0) for r in rows)
    avg = sum(r.busbw for r in rows) / len(rows) if rows else 0.0
    out.append(f"# Wrong values         : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    out.append(f"# Avg bus bandwidth    : {avg:.4g} ")
    return "\n".join(out)


def _subjects(libs: tuple[str, ...]) -> list[str]:
    """ndist's runs, and torch on backend "ndist" (``torch:ndist``, ``torch:ndist-python``,
    ``torch:ndist-op``: each is compared with Gloo and DeepSpeed; ndist's own runs and the other
    two are compared with ``torch:ndist``, which shows what torch's layer costs)."""
    nd = [lib for lib in libs if lib.startswith("ndist") or lib.startswith("torch:ndist")]
    return nd or list(libs[:1])


def ratio_rows(res: RunResult, op: str) -> list[dict]:
    """Per size: busbw and time of each ndist run divided by each comparator's
    (without ndist: the first comparator's divided by the others'). busbw ratio > 1 and time
    ratio < 1 mean the subject is faster."""
    libs = res.config.libraries
    subjects = _subjects(libs)
    out = []
    by = {(r.lib, r.size): r for r in res.rows if r.op == op}
    sizes = sorted({r.size for r in res.rows if r.op == op})
    for size in sizes:
        entry = {"size": size}
        for s in subjects:
            for other in libs:
                if other in subjects and not (other == "torch:ndist" and s != other):
                    continue  # ndist against the anchors (and torch:ndist), not against itself
                a, b = by.get((s, size)), by.get((other, size))
                if a is None or b is None:
                    continue
                entry[f"{s}/{other}"] = {
                    "busbw": a.busbw / b.busbw if b.busbw > 0 else None,
                    "time": a.time_us / b.time_us if b.time_us > 0 else None,
                }
        out.append(entry)
    return out


def format_ratios(res: RunResult, op: str) -> str:
    rows = ratio_rows(res, op)
    pairs = [k for k in (rows[0] if rows else {}) if k != "size"]
    if not pairs:
        return ""
    head1 = "# {:>10}".format("size") + "".join(f"  {p:>25}" for p in pairs)
    head2 = "# {:>10}".format("(B)") + "".join(f"  {'busbw x':>12} {'time x':>12}" for _ in pairs)
    lines = [f"#\n# Ratios for {op} (busbw > 1 and time < 1: the first is faster)", head1, head2]

    def f(x):
        return "n/a" if x is None else f"{x:.3f}"

    for r in rows:
        lines.append("  {:>10}".format(r["size"]) + "".join(
            f"  {f(r[p]['busbw']):>12} {f(r[p]['time']):>12}" if p in r else f"  {'':>25}" for p in pairs))
    return "\n".join(lines)


#: a round slower than this many times its cell's median counts as an outlier (issue 42's target)
SPREAD_LIMIT = 2.0


def spread_rows(res: RunResult) -> list[dict]:
    """Per library (in the run's order): its cells with a round above ``SPREAD_LIMIT`` times the
    cell's median, each as ``(op, size, median_us, [(round, us), ...])``, and its worst round."""
    out = []
    for lib in res.config.libraries:
        cells, worst = [], None
        for r in res.rows:
            if r.lib != lib or len(r.samples_us) < 2:
                continue
            med = statistics.median(r.samples_us)
            if med <= 0:
                continue
            slow = [(k, us) for k, us in enumerate(r.samples_us) if us > SPREAD_LIMIT * med]
            if slow:
                cells.append((r.op, r.size, med, slow))
            top = max(r.samples_us) / med
            if worst is None or top > worst[0]:
                worst = (top, r.op, r.size)
        if worst is not None:
            out.append({"lib": lib, "cells": cells, "worst": worst})
    return out


def format_spread(res: RunResult) -> str:
    """How far single rounds strayed from their cell's median, per library (with 2 rounds or more)."""
    rows = spread_rows(res)
    if not rows:
        return ""
    n = sum(1 for r in res.rows if r.lib == rows[0]["lib"])
    lines = [f"#\n# Round spread (rounds above {SPREAD_LIMIT:g}x their cell's median; round numbers from 0)"]
    for row in rows:
        top, op, size = row["worst"]
        lines.append(f"#  {row['lib']:<22} {len(row['cells'])} of {n} cells; worst round {top:.1f}x ({op} {size} B)")
        for op, size, med, slow in row["cells"]:
            lines.append(f"#    {op} {size} B, median {_fmt_time(med).strip()} us: "
                         + ", ".join(f"round {k} {_fmt_time(us).strip()} us" for k, us in slow))
    return "\n".join(lines)


def format_absent(lib: str, op: str, why: str, nproc: int) -> str:
    """The table of an op ``lib`` has no call for: its title and the reason, no rows."""
    return f"#\n# {op} -- {lib} -- nproc {nproc}\n# not offered: {why}"


def format_report(res: RunResult, argv: list[str] | None = None) -> str:
    parts = [format_header(res, argv)]
    for op in res.config.ops:
        for lib in res.config.libraries:
            why = res.why_absent(lib, op)
            if why:
                parts.append(format_absent(lib, op, why, res.config.nproc))
                continue
            parts.append(format_table(res.rows_for(lib, op), f"{op} -- {lib} -- nproc {res.config.nproc}"))
        if len(res.config.libraries) > 1:
            parts.append(format_ratios(res, op))
    parts.append(format_spread(res))
    return "\n".join(p for p in parts if p) + "\n"


def to_json(res: RunResult, argv: list[str] | None = None) -> str:
    cfg = res.config
    argv = sys.argv if argv is None else argv
    doc = {
        "command": ["ndist-bench", *argv[1:]],
        "machine": {**machine_info(), "load_start": list(res.load[0]), "load_end": list(res.load[1])},
        "config": dataclasses.asdict(cfg),
        "libraries": {lib: {"versions": res.versions.get(lib, {}), "launch": res.commands.get(lib, []),
                            "ranks": {str(k): v for k, v in res.ranks.get(lib, {}).items()}}
                      for lib in cfg.libraries},
        "results": [dataclasses.asdict(r) for r in res.rows],
        "ratios": {op: ratio_rows(res, op) for op in cfg.ops},
        "avg_busbw": {op: {lib: (sum(r.busbw for r in res.rows_for(lib, op)) / max(1, len(res.rows_for(lib, op))))
                           for lib in cfg.libraries if not res.why_absent(lib, op)} for op in cfg.ops},
        "absent": res.absent,  # lib -> op -> why it was not run (not offered by the library)
    }
    return json.dumps(doc, indent=1)
