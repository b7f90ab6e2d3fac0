"""``--markdown``: the libraries side by side, one Markdown table per op (for
``docs/performance.md``)."""

from __future__ import annotations

from ._report import ratio_rows
from ._runner import RunResult

__all__ = ["format_markdown"]


def _size(b: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k} {unit}"
    return f"{b} B"


def _x(v) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def format_markdown(res: RunResult) -> str:
    cfg = res.config
    out = []
    for op in cfg.ops:
        libs = [lib for lib in cfg.libraries if not res.why_absent(lib, op)]
        ratios = {r["size"]: r for r in ratio_rows(res, op)}
        pairs = [k for r in ratios.values() for k in r if k != "size"]
        pairs = list(dict.fromkeys(pairs))
        by = {(r.lib, r.size): r for r in res.rows if r.op == op}
        sizes = sorted({r.size for r in res.rows if r.op == op})
        title = f"**{op}**, {cfg.nproc} ranks, {cfg.dtype}"
        if op in ("all_reduce", "reduce", "reduce_scatter"):
            title += f", {cfg.redop}"
        out += [title, ""]
        for lib in cfg.libraries:
            if res.why_absent(lib, op):
                out += [f"Not offered by {lib}: {res.why_absent(lib, op)}.", ""]
        if not libs:
            continue
        head = ["size"] + [f"{lib} time (us)" for lib in libs] + [f"{lib} busbw (GB/s)" for lib in libs]
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "|".join("---:" for _ in head) + "|")
        for s in sizes:
            cells = [_size(s)]
            cells += [f"{by[(lib, s)].time_us:.1f}" if (lib, s) in by else "" for lib in libs]
            cells += [f"{by[(lib, s)].busbw:.3f}" if (lib, s) in by else "" for lib in libs]
            out.append("| " + " | ".join(cells) + " |")
        if pairs:
            out.append("")
            head = ["size"] + [f"{p} {what}" for p in pairs for what in ("busbw", "time")]
            out.append("| " + " | ".join(head) + " |")
            out.append("|" + "|".join("---:" for _ in head) + "|")
            for s in sizes:
                r = ratios.get(s, {})
                cells = [_size(s)]
                for p in pairs:
                    cells += [_x(r[p]["busbw"]), _x(r[p]["time"])] if p in r else ["", ""]
                out.append("| " + " | ".join(cells) + " |")
        wrong = sum(max(r.wrong, 0) for r in res.rows if r.op == op)
        checked = any(r.wrong >= 0 for r in res.rows if r.op == op)
        out.append("")
        out.append(f"Wrong elements: {wrong}" if checked else "Results not checked (-c 0).")
        out.append("")
    return "\n".join(out)
