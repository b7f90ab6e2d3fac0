"""ndist.testing: helpers for testing distributed code (run a function on N ranks)."""

from ._testing._run import RankFailedError, run_ranks

__all__ = ["run_ranks", "RankFailedError"]
