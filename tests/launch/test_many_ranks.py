"""A 128-rank job on one host (issue #18's start-up target): it starts, runs barrier,
all_reduce and all_to_all_single correctly on every rank, and exits cleanly. The time
against ``mpiexec -n 128`` is a benchmark (benchmarks/launch_startup.py), not checked here."""

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

JOB = """
import numpy as np
import ndist.distributed as dist

dist.init_process_group("socket")
r, n = dist.get_rank(), dist.get_world_size()
dist.barrier()
x = np.full(1024, r, np.float32)
dist.all_reduce(x)
assert (x == n * (n - 1) / 2).all(), (r, x[:4])
inp = np.arange(n * 4, dtype=np.float32) + 1000 * r
out = np.empty_like(inp)
dist.all_to_all_single(out, inp)
exp = np.concatenate([np.arange(4, dtype=np.float32) + 4 * r + 1000 * q for q in range(n)])
assert (out == exp).all(), r
print("rank", r, "of", n, "ok", flush=True)
dist.destroy_process_group()
"""


def test_a_128_rank_job_runs_its_collectives_and_exits_cleanly(launcher):
    script = launcher.script(JOB)
    proc = launcher.run("--nproc-per-node", 128, script, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    done = {line.split("rank ", 1)[1] for line in proc.stdout.splitlines() if line.endswith(" ok")}
    assert done == {f"{r} of 128 ok" for r in range(128)}, sorted(done)[:5]
