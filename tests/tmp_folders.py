"""A TMPDIR inside a test's own folder, for a process whose temporary files outlive it.

The run's temporary-file guard (``tests/conftest.py``) fails a test that leaves anything in
the run's TMPDIR. Some processes a test starts cannot clean up by design: a launcher or a
job the test SIGKILLs, and torchrun, which keeps its log folder (``torchelastic_*``) after
every job. Their TMPDIR goes under the test's ``tmp_path`` instead, which pytest owns.
"""

from __future__ import annotations

import os


def tmp_under(folder, name: str) -> str:
    """``folder/name``, made if missing: the TMPDIR to give such a process."""
    path = os.path.join(str(folder), name)
    os.makedirs(path, exist_ok=True)
    return path
