import os
import subprocess
import sys
import textwrap

import pytest
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


@pytest.fixture
def launcher(tmp_path):
    return Launcher(str(tmp_path))
