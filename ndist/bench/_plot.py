"""``--plot``: bus bandwidth against size, one line per library (matplotlib,
imported here only; ``pip install ndist[bench]``)."""

from __future__ import annotations

from ._runner import RunResult

__all__ = ["plot"]


def plot(res: RunResult, path: str) -> None:
    """Write one panel per op: busbw (GB/s) against size (B, log2 x axis)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ValueError("plot: needs matplotlib (pip install 'ndist[bench]')") from None
    cfg = res.config
    ops = [op for op in cfg.ops if any(r.op == op and r.size > 0 for r in res.rows)]  # barrier moves no bytes
    if not ops:
        raise ValueError(f"plot: no op with data to plot; got {', '.join(cfg.ops)}")
    fig = Figure(figsize=(6.4, 4.2 * len(ops)), layout="constrained")
    FigureCanvasAgg(fig)
    for i, op in enumerate(ops):
        ax = fig.add_subplot(len(ops), 1, i + 1)
        for lib in cfg.libraries:
            rows = res.rows_for(lib, op)
            if rows:
                ax.plot([r.size for r in rows], [r.busbw for r in rows], marker="o", markersize=3, label=lib)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (B)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"{op}, {cfg.nproc} ranks, {cfg.dtype}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.savefig(path, dpi=110)
