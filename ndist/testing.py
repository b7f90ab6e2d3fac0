"""ndist.testing: helpers for testing distributed code (run a function on N ranks)."""

from .runtime._testing import RankFailedError, run_ranks

__all__ = ["run_ranks", "RankFailedError"]
