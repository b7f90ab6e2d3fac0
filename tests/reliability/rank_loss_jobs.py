"""Run whole scripts as the ranks of one job, some of which are meant to die, for the
rank-loss tests: a ``TCPStoreServer`` of the test hosts the rendezvous (as ndistrun's
agent does, so the store outlives any rank), each rank is a fresh interpreter running
the script, and the test reads what each rank printed and how it ended.

Not a fixture of pytest's: a plain helper the tests call, with a hard deadline."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from dataclasses import dataclass

from ndist.runtime import _shmfiles
from ndist.runtime.store import TCPStoreServer


@dataclass
class Ended:
    code: int
    out: str
    err: str


def run_job(script: str, nproc: int, args=(), env=None, timeout: float = 60.0) -> list[Ended]:
    """Run ``script`` (a file) as ``nproc`` ranks; return each rank's exit code and output."""
    secret = secrets.token_hex(16)
    server = TCPStoreServer("127.0.0.1", 0, secret)
    procs = []
    try:
        base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        base.update(env or {})
        base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(server.port), NDIST_STORE=f"127.0.0.1:{server.port}",
                    NDIST_SECRET=secret, WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc))
        for rank in range(nproc):
            procs.append(subprocess.Popen([sys.executable, script, *map(str, args)],
                                          env=dict(base, RANK=str(rank), LOCAL_RANK=str(rank)),
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          start_new_session=True, stdin=subprocess.DEVNULL))
        ended = []
        for p in procs:
            try:
                out, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for q in procs:
                    _kill(q)
                out, err = p.communicate()
                err += f"\n[run_job: killed after {timeout:g} s]"
            ended.append(Ended(p.returncode, out, err))
        return ended
    finally:
        for p in procs:
            _kill(p)
            p.wait(10)
        server.close()
        _shmfiles.unlink_prefix(_shmfiles.job_prefix(secret) + "-")


def _kill(p: subprocess.Popen) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
