"""``--plot``: per op, time against size (log-log: the panel to read for small messages)
and bus bandwidth against size (log y, so sizes below 1 MiB do not sit on zero), one line
per library (matplotlib, imported here only; ``pip install 'ndist[bench]'``)."""

from __future__ import annotations

from ._runner import RunResult

__all__ = ["plot", "figure", "require_matplotlib"]

_NEEDS = "plot: needs matplotlib (pip install 'ndist[bench]')"


def require_matplotlib() -> None:
    """``ValueError`` when matplotlib cannot be imported: checked before the benchmark runs."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
        from matplotlib.figure import Figure  # noqa: F401
    except ImportError as e:
        raise ValueError(f"{_NEEDS}: {e}") from None


def _size_label(value: float, _pos=None) -> str:
    """Tick label of a byte count: 4K, 1M, 64M (binary multiples, as the -b / -e options)."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if value >= scale:
            return f"{value / scale:g}{unit}"
    return f"{value:g}"


def figure(res: RunResult):
    """The matplotlib ``Figure``: one row per op, (latency, busbw) panels side by side."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    cfg = res.config
    ops = [op for op in cfg.ops if any(r.op == op and r.size > 0 for r in res.rows)]  # barrier moves no bytes
    if not ops:
        raise ValueError(f"plot: no op with data to plot; got {', '.join(cfg.ops)}")
    fig = Figure(figsize=(11.0, 4.0 * len(ops)), layout="constrained")
    FigureCanvasAgg(fig)
    for i, op in enumerate(ops):
        lat = fig.add_subplot(len(ops), 2, 2 * i + 1)
        bw = fig.add_subplot(len(ops), 2, 2 * i + 2)
        for lib in cfg.libraries:
            rows = [r for r in res.rows_for(lib, op) if r.size > 0]
            if not rows:
                continue
            lat.plot([r.size for r in rows], [r.time_us for r in rows], marker="o", markersize=3, label=lib)
            moved = [r for r in rows if r.busbw > 0]  # 0 on one rank: nothing to draw on a log axis
            if moved:
                bw.plot([r.size for r in moved], [r.busbw for r in moved], marker="o", markersize=3, label=lib)
        what = f"{op}, {cfg.nproc} rank{'s' if cfg.nproc != 1 else ''}, {cfg.dtype}"
        lat.set_xscale("log", base=2)
        lat.set_yscale("log")
        lat.set_ylabel("time per call (us)")
        lat.set_title(f"{what}: latency")
        bw.set_xscale("log", base=2)
        bw.set_ylabel("busbw (GB/s)")
        bw.set_title(f"{what}: bus bandwidth")
        if bw.get_lines():
            bw.set_yscale("log")
        else:
            bw.text(0.5, 0.5, f"no bus traffic on {cfg.nproc} rank", ha="center", va="center",
                    transform=bw.transAxes)
        for ax in (lat, bw):
            ax.xaxis.set_major_formatter(FuncFormatter(_size_label))
            ax.set_xlabel("size (B)")
            ax.grid(True, which="both", alpha=0.3)
            if ax.get_lines():
                ax.legend(fontsize="small")
    return fig


def plot(res: RunResult, path: str) -> None:
    """Write :func:`figure` to ``path`` (PNG, SVG or PDF by its extension)."""
    figure(res).savefig(path, dpi=110)
