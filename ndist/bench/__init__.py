"""ndist.bench: ``ndist-bench``, collective benchmarks in the style of nccl-tests.

Runs one or more ops over a size sweep on ``--nproc`` local ranks through ndist
and, in the same invocation, through raw mpi4py and torch.distributed (Gloo),
alternating between them, and prints nccl-tests-shaped tables, ratios, JSON and
a plot. See ``docs/performance.md``.
"""

from ._cli import main
from ._config import BenchConfig, parse_args, parse_size, size_sweep
from ._launch import BenchError
from ._ops import OPS, bandwidths, layout
from ._runner import Row, RunResult, run_bench

__all__ = ["main", "BenchConfig", "parse_args", "parse_size", "size_sweep", "BenchError", "OPS", "bandwidths",
           "layout", "Row", "RunResult", "run_bench"]
