"""Run a sweep through every library, alternating, and collect rows.

All libraries' ranks are started first and stay up for the whole invocation.
For each op and size, each library is measured in turn (``rounds`` times,
interleaved), and the order rotates from one size and round to the next, so
the drift of a shared machine lands on every library alike. While one library
runs, the others' ranks sleep in a socket read. An op a library has no call for
(``not_offered``) is absent from its results, with the reason; a library with no
op left is not started.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import statistics
import sys

from ..launch._binding import plan
from ._adapters import not_offered
from ._config import BenchConfig
from ._launch import MPI_LIBRARIES, RankGroup, bound_like_ndistrun, find_mpiexec
from ._ops import OPS, bandwidths, layout, resolve_dtype

__all__ = ["Row", "RunResult", "run_bench", "check_available"]

log = logging.getLogger("ndist.bench")


@dataclasses.dataclass
class Row:
    """One line of a table: one library, one op, one size."""

    lib: str
    op: str
    size: int  # bytes (nccl-tests' ``size`` column)
    count: int  # elements per call argument
    type: str
    redop: str
    root: int
    time_us: float  # median (or min, --stat) over rounds of (max over ranks of the mean time per call)
    algbw: float  # GB/s
    busbw: float  # GB/s
    wrong: int  # -1: not checked
    samples_us: list[float] = dataclasses.field(default_factory=list)  # one per round


@dataclasses.dataclass
class RunResult:
    config: BenchConfig
    rows: list[Row]
    ranks: dict[str, dict]  # lib -> rank -> {"pid", "host"}
    versions: dict[str, dict]  # lib -> versions reported by its rank 0
    commands: dict[str, list[str]]  # lib -> the command that started its ranks
    schedule: list[tuple[str, int, int, str]] = dataclasses.field(default_factory=list)  # (op, size, round, lib)
    load: tuple[tuple[float, ...], tuple[float, ...]] = ((), ())  # 1/5/15-min load average at start and end
    absent: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)  # lib -> op -> why not run

    def rows_for(self, lib: str, op: str) -> list[Row]:
        return [r for r in self.rows if r.lib == lib and r.op == op]

    def why_absent(self, lib: str, op: str) -> str | None:
        """Why ``lib`` has no rows for ``op`` (None: it ran)."""
        return self.absent.get(lib, {}).get(op)


def check_available(libs) -> None:
    """Raise ``ValueError`` for a library that cannot run here, before starting any."""
    for lib in libs:
        if lib in MPI_LIBRARIES:
            if importlib.util.find_spec("mpi4py") is None:
                raise ValueError(f"{lib}: needs mpi4py, which is not installed for {sys.executable} "
                                 "(pip install mpi4py mpich, or leave it out of --backend / --compare)")
            if find_mpiexec() is None:
                raise ValueError(f"{lib}: needs mpiexec (the mpich wheel), found neither next to "
                                 f"{sys.executable} nor on PATH (pip install mpich)")
        if (lib.startswith("torch") or lib == "deepspeed") and importlib.util.find_spec("torch") is None:
            raise ValueError(f"compare: {lib} needs torch, which is not installed for {sys.executable} "
                             "(pip install torch, or leave it out of --compare)")
        if lib == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
            raise ValueError(f"compare: deepspeed is not installed for {sys.executable} (pip install "
                             "--no-build-isolation deepspeed next to torch: docs/performance.md, How to run; "
                             "or leave it out of --compare)")


def _supported(lib: str, dtype: str) -> str | None:
    """Why ``lib`` cannot run ``dtype`` (None: it can)."""
    if lib in MPI_LIBRARIES and dtype == "bfloat16":
        return "MPI has no bfloat16 datatype"
    return None


def run_bench(cfg: BenchConfig, progress=None, start=None) -> RunResult:
    """Run every op of ``cfg`` over its sizes through every library; rows in order.
    ``start(lib)``: a started ``RankGroup`` of ``cfg.nproc`` ranks running ``lib`` (default:
    on this machine); ``benchmarks/multihost.py`` places them on several hosts."""
    libs = list(cfg.libraries)
    check_available(libs)
    for lib in libs:
        why = _supported(lib, cfg.dtype)
        if why:
            raise ValueError(f"datatype: {lib} cannot run {cfg.dtype}: {why}")
    itemsize = resolve_dtype(cfg.dtype).itemsize
    absent: dict[str, dict[str, str]] = {}
    for lib in libs:
        for op in cfg.ops:
            why = not_offered(lib, op, cfg.dtype, cfg.redop)
            if why:
                absent.setdefault(lib, {})[op] = why
                log.info("ndist-bench: %s has no %s: %s", lib, op, why)
    # ndist's ranks (its own API and torch on "ndist") are bound as ndistrun binds them
    # (--bind-to); the others run as their launchers' defaults do (bound_like_ndistrun)
    cpus = plan(cfg.bind_to, cfg.nproc)[1]
    load_start = _loadavg()
    groups: dict[str, RankGroup] = {}
    rows: list[Row] = []
    schedule: list[tuple[str, int, int, str]] = []
    try:
        for lib in libs:
            if len(absent.get(lib, ())) < len(cfg.ops):  # nothing to run: not started
                groups[lib] = (start(lib) if start is not None
                               else RankGroup(lib, cfg.nproc, cfg.timeout, cpus=cpus if bound_like_ndistrun(lib) else ())
                               .start())
        step = 0
        for op in cfg.ops:
            spec = OPS[op]
            for nbytes in (cfg.sizes[:1] if op == "barrier" else cfg.sizes):  # barrier: no size to sweep
                lay = layout(op, nbytes, itemsize, cfg.nproc)
                if op != "barrier" and lay.count == 0:
                    log.info("ndist-bench: %s %d B skipped: less than one element per rank", op, nbytes)
                    continue
                here = [lib for lib in libs if op not in absent.get(lib, {})]
                if not here:
                    continue
                samples: dict[str, list[float]] = {lib: [] for lib in here}
                wrong = dict.fromkeys(here, 0)
                for rnd in range(cfg.rounds):
                    order = here[step % len(here):] + here[: step % len(here)]
                    step += 1
                    for lib in order:
                        req = {"op": op, "nbytes": nbytes, "dtype": cfg.dtype, "redop": cfg.redop,
                               "root": cfg.root, "iters": cfg.iters, "warmup": cfg.warmup,
                               "check": cfg.check if rnd == 0 else 0}
                        schedule.append((op, nbytes, rnd, lib))
                        res = groups[lib].run(req)
                        samples[lib].append(max(r["seconds"] for r in res))
                        wrong[lib] += sum(r["wrong"] for r in res)
                for lib in here:
                    sec = min(samples[lib]) if cfg.stat == "min" else statistics.median(samples[lib])
                    algbw, busbw = bandwidths(op, lay.size, sec, cfg.nproc)
                    row = Row(
                        lib=lib, op=op, size=lay.size, count=lay.count, type=cfg.dtype,
                        redop=cfg.redop if spec.reduces else "none", root=cfg.root if spec.rooted else -1,
                        time_us=sec * 1e6, algbw=algbw, busbw=busbw,
                        wrong=wrong[lib] if cfg.check else -1, samples_us=[s * 1e6 for s in samples[lib]],
                    )
                    rows.append(row)
                    if progress is not None:
                        progress(row)
        for g in groups.values():
            g.stop()
    except BaseException:
        for g in groups.values():
            g.kill()
        raise
    return RunResult(
        config=cfg, rows=rows,
        ranks={lib: g.ranks for lib, g in groups.items()},
        versions={lib: g.versions for lib, g in groups.items()},
        commands={lib: g.command for lib, g in groups.items()},
        schedule=schedule,
        load=(load_start, _loadavg()),
        absent=absent,
    )


def _loadavg() -> tuple[float, ...]:
    try:
        return tuple(round(x, 2) for x in os.getloadavg())
    except (AttributeError, OSError):
        return ()

