"""``entry`` = ``recorded.mismatch_entry``: a module mpiexec can import by name."""

from tests.collectives.recorded import mismatch_entry as entry  # noqa: F401
