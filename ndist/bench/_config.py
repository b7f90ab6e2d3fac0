"""Command line of ``ndist-bench``: sizes, the sweep, and the run configuration."""

from __future__ import annotations

import argparse
import dataclasses
import re

from ..launch._binding import plan
from ._ops import DTYPES, OPS, REDOPS, resolve_dtype

__all__ = ["BenchConfig", "parse_size", "size_sweep", "build_parser", "parse_args", "LIBRARIES", "NDIST_BACKENDS"]

# Comparators accepted by --compare, and the ndist backends accepted by --backend.
# ``torch`` is torch.distributed on Gloo, ``torch:ndist`` torch.distributed on backend "ndist"
# (ndist.torch): the same torch calls, so the pair shows what going through torch costs.
# ``torch:ndist`` runs its compiled backend, ``torch:ndist-python`` its Python one, ``torch:ndist-op``
# ndist's torch custom ops (torch.ops.ndist.*: all_reduce, broadcast, all_gather).
# ``deepspeed`` is DeepSpeed's shared-memory all_reduce (CPU tensor parallelism): all_reduce only.
LIBRARIES = ("mpi4py", "torch", "torch:ndist", "torch:ndist-python", "torch:ndist-op", "deepspeed")
NDIST_BACKENDS = ("socket", "mpi")

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kKmMgGtT]?)(?:i?[bB])?\s*$")


def parse_size(text: str, *, name: str = "size") -> int:
    """Bytes for ``8``, ``1K``, ``64M``, ``1G`` (binary multiples, as nccl-tests;
    ``1KB``/``1KiB``/``1.5M`` are accepted too)."""
    if not isinstance(text, str):
        raise TypeError(f"{name}: expected a str such as '64M'; got {type(text).__name__}")
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(f"{name}: expected a byte count such as 8, 1K, 64M or 1G; got {text!r}")
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if value != int(value):
        raise ValueError(f"{name}: expected a whole number of bytes; got {text!r} = {value} bytes")
    return int(value)


def size_sweep(min_bytes: int, max_bytes: int, factor: int = 2, step_bytes: int = 0) -> list[int]:
    """Sizes from ``min_bytes`` to ``max_bytes``: multiplied by ``factor`` when it is
    above 1, else incremented by ``step_bytes`` (nccl-tests' ``-f`` / ``-i``)."""
    if min_bytes < 0:
        raise ValueError(f"minbytes: expected >= 0; got {min_bytes}")
    if max_bytes < min_bytes:
        raise ValueError(f"maxbytes: expected >= minbytes ({min_bytes}); got {max_bytes}")
    if factor < 1:
        raise ValueError(f"stepfactor: expected >= 1; got {factor}")
    if factor == 1 and step_bytes <= 0:
        raise ValueError(f"stepbytes: expected > 0 when stepfactor is 1; got {step_bytes}")
    if factor > 1 and min_bytes == 0:
        raise ValueError("minbytes: expected > 0 with a step factor (0 never grows); got 0")
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size = size * factor if factor > 1 else size + step_bytes
    return sizes


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """One invocation: the ops, the sweep, and the libraries to run it through."""

    ops: tuple[str, ...]
    sizes: tuple[int, ...]
    iters: int = 20
    warmup: int = 5
    check: int = 1
    dtype: str = "float32"
    redop: str = "sum"
    root: int = 0
    nproc: int = 2
    backends: tuple[str, ...] = ("socket",)  # ndist backends; () runs the comparators only
    compare: tuple[str, ...] = ()
    rounds: int = 1
    stat: str = "median"  # how rounds combine: median or min
    timeout: float = 300.0
    json_path: str | None = None
    plot_path: str | None = None
    markdown_path: str | None = None
    quiet: bool = False
    #: ndist's own ranks (not under mpiexec), ndistrun's --bind-to value: "core" / "core:N" bind
    #: each to CPUs of its own, "core:overload-allowed" also one CPU each when they are more than
    #: the CPUs; "none" leaves them unbound; None: ndistrun's default (core from 2 ranks
    #: when there are as many usable CPUs)
    bind_to: str | None = None

    @property
    def libraries(self) -> tuple[str, ...]:
        """Every run, as ``ndist[socket]``, ``ndist[mpi]``, ``mpi4py``, ``torch``, ``torch:ndist``, ``deepspeed``."""
        return tuple(f"ndist[{b}]" for b in self.backends) + self.compare


def _positive(name):
    def conv(text):
        try:
            v = int(text, 0)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: expected an integer; got {text!r}") from None
        if v < 0:
            raise argparse.ArgumentTypeError(f"{name}: expected >= 0; got {v}")
        return v

    return conv


def _size_arg(name):
    def conv(text):
        try:
            return parse_size(text, name=name)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return conv


def _list_arg(name, choices):
    def conv(text):
        items = tuple(x.strip() for x in text.split(",") if x.strip())
        bad = [x for x in items if x not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"{name}: expected a comma list of {', '.join(choices)}; got {', '.join(bad)}")
        return tuple(dict.fromkeys(items))

    return conv


_EPILOG = """\
examples:
  ndist-bench all_reduce                             32 MiB float32 all_reduce, 2 ranks, socket
  ndist-bench all_reduce all_to_all -b 4K -e 64M -f 4 --nproc 4
  ndist-bench all_reduce -b 1K -e 16M --backend socket,mpi --compare mpi4py,torch \\
      --rounds 5 --markdown table.md --plot sweep.png
  ndist-bench all --backend none --compare mpi4py    the comparators only
  ndist-bench all_reduce -b 4K -e 16M --compare torch,torch:ndist
                                                     torch.distributed on Gloo and on backend "ndist"
  ndist-bench all_reduce -b 4K -e 16M -f 4 --compare mpi4py,torch,deepspeed
                                                     with DeepSpeed's shared-memory all_reduce too
  ndist-bench all_reduce -b 4K -e 16M -f 4 --compare torch:ndist,torch:ndist-op,deepspeed
                                                     torch on "ndist" (compiled), ndist's custom op
                                                     and DeepSpeed's inference_all_reduce

Columns as nccl-tests: time per iteration, algbw = size / time, busbw = algbw
scaled by the op's traffic factor (all_reduce: 2(n-1)/n), #wrong = elements
that failed the check. The ranks run on this machine only. The mpi backend and
mpi4py need mpi4py and an mpiexec (the mpich wheel's, next to python, or on
PATH); torch and torch:ndist* need torch installed (torch:ndist and
torch:ndist-op a C++ compiler: ndist's compiled torch module), deepspeed needs DeepSpeed
(it runs all_reduce with sum on float32, float16 and bfloat16 only; other ops
are printed as not offered).
Exit status: 0; 1 when a result was wrong; 2 for bad arguments or a library
that is not installed; 3 when a library failed or timed out. See
docs/performance.md.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ndist-bench",
        description="Collective benchmarks in the style of nccl-tests, for ndist and, side by side,\n"
        "raw mpi4py and torch.distributed (Gloo).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser = p
    p.add_argument("ops", nargs="+", metavar="op", help=f"one or more of: {', '.join(OPS)}, or 'all'")
    p = parser.add_argument_group("sizes and iterations (nccl-tests' options)")
    p.add_argument("-b", "--minbytes", type=_size_arg("minbytes"), default=parse_size("32M"), help="smallest message size in bytes per rank: 8, 1K, 64M, 1G. Default 32M")
    p.add_argument("-e", "--maxbytes", type=_size_arg("maxbytes"), default=parse_size("32M"), help="largest size. Default 32M")
    p.add_argument("-f", "--stepfactor", type=_positive("stepfactor"), default=2, help="multiply the size by this between steps. Default 2")
    p.add_argument("-i", "--stepbytes", type=_size_arg("stepbytes"), default=parse_size("1M"), help="add this to the size between steps when -f is 1. Default 1M")
    p.add_argument("-n", "--iters", type=_positive("iters"), default=20, help="timed iterations per size. Default 20")
    p.add_argument("-w", "--warmup_iters", type=_positive("warmup_iters"), default=5, help="untimed warm-up iterations per size. Default 5")
    p.add_argument("-c", "--check", type=_positive("check"), default=1, help="check results N times per size (0: off). Default 1")
    p = parser.add_argument_group("data")
    p.add_argument("-d", "--datatype", default="float32", help=f"one of {', '.join(DTYPES)} (or float, half, double). Default float32")
    p.add_argument("-o", "--op", default="sum", choices=REDOPS, help="reduction op. Default sum")
    p.add_argument("-r", "--root", type=_positive("root"), default=0, help="root rank of broadcast, reduce, gather, scatter. Default 0")
    p = parser.add_argument_group("libraries and ranks")
    p.add_argument("--nproc", type=_positive("nproc"), default=2, help="ranks per library, on this machine. Default 2")
    p.add_argument("--backend", type=_list_arg("backend", NDIST_BACKENDS + ("none",)), default=("socket",),
                   help="ndist backend(s): socket, mpi, comma separated (default socket); 'none' runs only --compare")
    p.add_argument("--compare", type=_list_arg("compare", LIBRARIES), default=(),
                   help="also run raw mpi4py (MPICH), torch.distributed on Gloo (torch) and/or on backend "
                        "\"ndist\" (torch:ndist: its compiled backend; torch:ndist-python: its Python backend; "
                        "torch:ndist-op: ndist's torch custom ops), DeepSpeed's shared-memory all_reduce "
                        "(deepspeed), comma separated")
    p.add_argument("--rounds", type=_positive("rounds"), default=1,
                   help="measure each size this many times per library, interleaved (see --stat)")
    p.add_argument("--stat", choices=("median", "min"), default="median",
                   help="combine the rounds' times by median (default) or min (least disturbed round)")
    p.add_argument("--bind-to", "--bind_to", dest="bind_to", default=None,
                   metavar="core|core:N|core:overload-allowed|none",
                   help="ndist's ranks (not under mpiexec): 'core' binds each to CPUs of its own (an equal share of "
                        "whole cores; 'core:N': N cores each; 'core:overload-allowed': with more ranks than "
                        "CPUs, one CPU each, shared evenly), 'none' leaves "
                        "them unbound. Default: as ndistrun, core when --nproc is 2 or more and at most the usable "
                        "CPUs. The other libraries run as their launchers' defaults do: unbound")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one size may take before the run is aborted")
    p = parser.add_argument_group("output")
    p.add_argument("--json", dest="json_path", metavar="PATH", help="write machine-readable results")
    p.add_argument("--plot", dest="plot_path", metavar="PATH",
                   help="plot time (log-log) and busbw (log) against size (needs matplotlib: pip install 'ndist[bench]')")
    p.add_argument("--markdown", dest="markdown_path", metavar="PATH", help="write the libraries side by side as Markdown")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    return parser


def parse_args(argv: list[str] | None = None) -> BenchConfig:
    """Parse and validate ``argv``; errors exit with argparse's usage message."""
    p = build_parser()
    a = p.parse_args(argv)
    ops = tuple(OPS) if a.ops == ["all"] else tuple(dict.fromkeys(a.ops))
    bad = [o for o in ops if o not in OPS]
    if bad:
        p.error(f"op: expected one of {', '.join(OPS)} or 'all'; got {', '.join(bad)}")
    try:
        dt = resolve_dtype(a.datatype)
        sizes = size_sweep(a.minbytes, a.maxbytes, a.stepfactor, a.stepbytes)
    except ValueError as e:
        p.error(str(e))
    backends = tuple(b for b in a.backend if b != "none")
    if not backends and not a.compare:
        p.error("backend: 'none' needs at least one library in --compare")
    if a.nproc < 1:
        p.error(f"nproc: expected >= 1; got {a.nproc}")
    for o in ops:
        if a.nproc < OPS[o].min_ranks:
            p.error(f"nproc: {o} needs at least {OPS[o].min_ranks} ranks; got {a.nproc}")
    if a.root >= a.nproc:
        p.error(f"root: expected a rank in 0..{a.nproc - 1}; got {a.root}")
    if a.iters < 1:
        p.error(f"iters: expected >= 1; got {a.iters}")
    if a.rounds < 1:
        p.error(f"rounds: expected >= 1; got {a.rounds}")
    if not a.timeout > 0:
        p.error(f"timeout: expected > 0 seconds; got {a.timeout}")
    try:  # (checked here; kept as given, so that the runner plans ``core:N`` and the others as asked)
        bind_to = "none" if plan(a.bind_to, a.nproc)[0] == "none" else a.bind_to
    except ValueError as e:
        p.error(str(e).replace("--nproc-per-node", "--nproc"))
    return BenchConfig(
        ops=ops, sizes=tuple(sizes), iters=a.iters, warmup=a.warmup_iters, check=a.check, dtype=dt.name,
        redop=a.op, root=a.root, nproc=a.nproc, backends=backends, compare=a.compare, rounds=a.rounds, stat=a.stat,
        timeout=a.timeout, json_path=a.json_path, plot_path=a.plot_path, markdown_path=a.markdown_path,
        quiet=a.quiet, bind_to=bind_to,
    )
