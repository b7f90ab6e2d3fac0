"""Running torch programs on real ranks: ``run_torch`` starts ``world_size``
processes (``ndist.testing.run_ranks``), each of which joins a torch process
group on ``backend`` through a FileStore in the test's temporary folder (no
port), runs ``fn(rank, world_size, *args)`` and destroys the group."""

from __future__ import annotations

import os
import uuid
from datetime import timedelta

from ndist.testing import run_ranks
from tests.tmp_folders import tmp_under


def _entry(rank, world_size, fn, backend, path, args, timeout):
    import torch
    import torch.distributed as dist

    import ndist.torch  # noqa: F401 - registers "ndist"
    from ndist.collectives.backends.socket.wire._segment import job_prefix
    from ndist.runtime import _net

    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"file://{path}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout))
    try:
        result = fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()
    return job_prefix(_net.job_secret()), result


def shm_files(prefix: str) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))


def run_torch(fn, world_size: int, backend: str, tmp_path, *, args: tuple = (), timeout: float = 120,
              group_timeout: float = 60) -> list:
    """``fn``'s results by rank; asserts that the ranks left no shared memory behind."""
    path = os.path.join(str(tmp_path), f"store-{backend}-{uuid.uuid4().hex[:8]}")
    out = run_ranks(_entry, world_size, args=(fn, backend, path, tuple(args), group_timeout), init=False,
                    timeout=timeout)
    prefix = out[0][0]
    assert shm_files(prefix) == [], f"shared memory left behind by {backend}: {shm_files(prefix)}"
    return [r for _, r in out]


def torchrun_tmp(cwd) -> str:
    """TMPDIR for a torchrun the test starts: torchrun keeps its log folder (``torchelastic_*``)
    after the job, so it goes under ``cwd`` (pytest's ``tmp_path``), not the run's TMPDIR."""
    return tmp_under(cwd, "torchrun-tmp")
