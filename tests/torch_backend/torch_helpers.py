"""Running torch programs on real ranks: ``run_torch`` starts ``world_size``
processes (``ndist.testing.run_ranks``), each of which joins a torch process
group on ``backend`` through a FileStore in the test's temporary folder (no
port), runs ``fn(rank, world_size, *args)`` and destroys the group;
``run_torch_and_gloo`` runs a function on backend "ndist" and then on Gloo in one job (the
reference of a comparison); ``run_torch_with_victim`` runs a job one rank of which dies."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import uuid
from datetime import timedelta

from ndist.testing import run_ranks
from tests.tmp_folders import tmp_under


def _entry(rank, world_size, fn, backend, path, args, timeout, destroy=True, secret=None):
    import torch
    import torch.distributed as dist

    import ndist.torch  # noqa: F401 - registers "ndist"
    from ndist.collectives.backends.socket.wire._segment import job_prefix
    from ndist.runtime import _net

    if secret is not None:  # the job's own: its shared-memory files are not the run's (run_ranks removes those)
        os.environ["NDIST_SECRET"] = secret
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"file://{path}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout))
    if not destroy:
        return job_prefix(_net.job_secret()), fn(rank, world_size, *args)
    try:
        result = fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()
    return job_prefix(_net.job_secret()), result


def shm_files(prefix: str) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))


def run_torch(fn, world_size: int, backend: str, tmp_path, *, args: tuple = (), timeout: float = 120,
              group_timeout: float = 60, env=None) -> list:
    """``fn``'s results by rank (``env``: variables added to the ranks'); asserts that the ranks
    left no shared memory behind."""
    path = os.path.join(str(tmp_path), f"store-{backend}-{uuid.uuid4().hex[:8]}")
    out = run_ranks(_entry, world_size, args=(fn, backend, path, tuple(args), group_timeout), init=False,
                    timeout=timeout, env=env)
    # (run_ranks removes the run's files once its ranks are gone, and says which it found)
    assert out.shm_left == [], f"shared memory left behind by {backend}: {out.shm_left}"
    return [r for _, r in out]


def _entry_on_each(rank, world_size, fn, backends, paths, args, timeout):
    """``fn`` on each of ``backends`` in turn, in this process: ``{backend: (job prefix, result)}``."""
    return {backend: _entry(rank, world_size, fn, backend, path, args, timeout)
            for backend, path in zip(backends, paths)}


def run_torch_and_gloo(fn, world_size: int, tmp_path, *, backend: str = "ndist", args: tuple = (),
                       timeout: float = 180, group_timeout: float = 60, env=None) -> tuple[list, list]:
    """``(fn's results by rank on backend, on Gloo)``: one job, whose ranks run ``fn`` on
    ``backend`` (first) and then on Gloo, each between its own ``init_process_group`` and
    ``destroy_process_group``, as ``run_torch`` runs them: the reference costs no second
    start of every rank (an interpreter that imports torch). Asserts that the ranks left no
    shared memory behind."""
    backends = (backend, "gloo")
    paths = tuple(os.path.join(str(tmp_path), f"store-{b}-{uuid.uuid4().hex[:8]}") for b in backends)
    out = run_ranks(_entry_on_each, world_size, args=(fn, backends, paths, tuple(args), group_timeout), init=False,
                    timeout=timeout, env=env)
    assert out.shm_left == [], f"shared memory left behind by {backend}: {out.shm_left}"
    return tuple([r[b][1] for r in out] for b in backends)


def run_torch_with_victim(fn, world_size: int, backend: str, tmp_path, victim: int, *, args: tuple = (),
                          timeout: float = 180, group_timeout: float = 60, env=None) -> list:
    """``fn``'s results by rank (the victim's: None) on a job whose rank ``victim`` dies; the
    survivors end without destroying their group, as a program that failed does. Asserts that
    the job left no shared memory once every rank is gone (the job has a secret of its own:
    ``run_ranks`` removes the run's files when it ends)."""
    from ndist.runtime._shmfiles import SHM_DIR, job_prefix

    secret = secrets.token_hex(16)
    path = os.path.join(str(tmp_path), f"store-{backend}-{uuid.uuid4().hex[:8]}")
    try:
        out = run_ranks(_entry, world_size, args=(fn, backend, path, tuple(args), group_timeout, False, secret),
                        init=False, timeout=timeout, may_die=[victim], env=env)
    finally:
        left = shm_files(job_prefix(secret))
        for name in left:
            os.unlink(os.path.join(SHM_DIR, name))
    assert left == [], f"shared memory left behind by {backend}: {left}"
    return [None if o is None else o[1] for o in out]


#: a launcher's variables, left out of the environment of a launcher or a program a test starts
STRIP = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NDIST_STORE",
         "NDIST_SECRET")


def clean_env(**extra) -> dict:
    """This process's environment without ``STRIP``'s variables, plus ``extra``."""
    return {**{k: v for k, v in os.environ.items() if k not in STRIP}, **extra}


def run_command(argv, env, cwd=None, timeout: float = 150):
    """Run ``argv`` (a launcher, a program) in a session of its own: ``(returncode, stdout,
    stderr)``; past ``timeout`` seconds it is killed, with everything it started."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out, err


def torchrun_tmp(cwd) -> str:
    """TMPDIR for a torchrun the test starts: torchrun keeps its log folder (``torchelastic_*``)
    after the job, so it goes under ``cwd`` (pytest's ``tmp_path``), not the run's TMPDIR."""
    return tmp_under(cwd, "torchrun-tmp")
