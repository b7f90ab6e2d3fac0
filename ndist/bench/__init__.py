"""ndist.bench: ``ndist-bench``, collective benchmarks in the style of nccl-tests.

Runs one or more ops over a size sweep on ``--nproc`` local ranks through ndist
and, in the same invocation, through raw mpi4py and torch.distributed (Gloo),
alternating between them, and prints nccl-tests-shaped tables, ratios, JSON and
a plot. See ``docs/performance.md``.
"""

from ._adapters import STORE_HOST_ENV
from ._cli import main
from ._config import BenchConfig, parse_args, parse_size, size_sweep
from ._launch import MPI_LIBRARIES, BenchError, RankGroup, find_mpiexec, rank_command
from ._ops import OPS, bandwidths, layout
from ._report import ratio_rows, to_json
from ._runner import Row, RunResult, run_bench

# The names a driver that places the ranks itself needs (benchmarks/multihost.py: its own
# RankGroup subclass, rank_command, run_bench(start=...), the report's ratios and JSON;
# benchmarks/placement.py: RankGroup.run's per-rank results) are public too: docs/performance.md,
# "The Python API".
__all__ = ["main", "BenchConfig", "parse_args", "parse_size", "size_sweep", "BenchError", "OPS", "bandwidths",
           "layout", "Row", "RunResult", "run_bench", "RankGroup", "rank_command", "MPI_LIBRARIES", "find_mpiexec",
           "STORE_HOST_ENV", "ratio_rows", "to_json"]
