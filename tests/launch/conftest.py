import os
import secrets
import subprocess
import sys
import textwrap

import pytest
from tests.launch.launch_helpers import free_port, wait_for
from tests.tmp_folders import tmp_under


class Launcher:
    """Runs ``python -m ndist.launch`` in a subprocess, in ``cwd`` (a tmp dir)."""

    def __init__(self, cwd):
        self.cwd = cwd

    def script(self, body: str, name: str = "job.py") -> str:
        path = os.path.join(self.cwd, name)
        with open(path, "w") as f:
            f.write(textwrap.dedent(body))
        return path

    def cmd(self, *args) -> list:
        return [sys.executable, "-m", "ndist.launch", *map(str, args)]

    def run(self, *args, timeout=60, env=None, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.cmd(*args), cwd=self.cwd, capture_output=True, text=True, timeout=timeout, env=env, **kw
        )

    def popen(self, *args, env=None, **kw) -> subprocess.Popen:
        return subprocess.Popen(
            self.cmd(*args), cwd=self.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **kw
        )

    def popen_to_kill(self, *args, env=None, **kw) -> subprocess.Popen:
        """``popen`` for a launcher the test SIGKILLs: it cannot remove its job folder then, so
        its TMPDIR is a folder under ``cwd`` (pytest's ``tmp_path``), not the run's."""
        return self.popen(*args, env={**(os.environ if env is None else env), "TMPDIR": tmp_under(self.cwd, "killed-tmp")}, **kw)

    def node_job(self, nnodes=2, rdzv_timeout=30, env=None) -> tuple:
        """``(args, env)`` of a job of ``nnodes`` nodes on loopback: ``--nnodes``,
        ``--master-addr``, a free ``--master-port``, ``--rdzv-timeout``; ``env`` (default: this
        process's) with one fresh job secret."""
        env = {**(os.environ if env is None else env), "NDIST_SECRET": secrets.token_hex(32)}
        return ["--nnodes", nnodes, "--master-addr", "127.0.0.1", "--master-port", free_port(),
                "--rdzv-timeout", rdzv_timeout], env

    def nodes(self, *args, env=None, each=((), ()), first=0, to_kill=(), rdzv_timeout=30, job=None,
              script="job.py") -> list:
        """The agents of a job of ``len(each)`` nodes (``node_job``, or ``job``), by node rank:
        ``args`` on every node, ``each[i]`` on node i alone; node ``first`` starts first; the
        nodes in ``to_kill`` are started with ``popen_to_kill``."""
        common, env = job or self.node_job(len(each), rdzv_timeout, env)
        procs = {}
        for n in sorted(range(len(each)), key=lambda n: n != first):
            start = self.popen_to_kill if n in to_kill else self.popen
            procs[n] = start(*common, *args, "--node-rank", n, *each[n], script, env=env)
        return [procs[n] for n in range(len(each))]

    def wait_files(self, prefix: str, ranks, timeout: float, what: str) -> None:
        """Wait until every rank of ``ranks`` has written ``<prefix><rank>`` in ``cwd``."""
        wait_for(lambda: all(os.path.exists(os.path.join(self.cwd, f"{prefix}{r}")) for r in ranks), timeout, what)

    @staticmethod
    def communicate(procs, timeout=60) -> list:
        """``(stdout, stderr)`` of every agent once it has exited (``timeout`` each); every one
        is killed on the way out."""
        try:
            return [p.communicate(timeout=timeout) for p in procs]
        finally:
            for p in procs:
                p.kill()


@pytest.fixture
def launcher(tmp_path):
    return Launcher(str(tmp_path))
