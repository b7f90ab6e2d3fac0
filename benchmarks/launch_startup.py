"""Start-to-exit time of ``ndistrun`` against ``mpiexec`` (and ``torchrun`` when installed).

    python benchmarks/launch_startup.py [-n 4] [-r 10] [-w 1] [--ndist-script S] [--mpi-script S] [--torchrun]

Each command runs ``-w`` times to warm the caches, then ``-r`` times; the
table shows median / mean / min / stddev of the wall-clock time (hyperfine
style), the median CPU time of all the run's processes (steadier than wall
time on a busy machine) and the ratio of wall-clock medians to ``mpiexec``. The default scripts do one all-reduce of a
one-element array: ``ndist.distributed.all_reduce`` after
``init_process_group()`` (a barrier on the launcher's store when no
collective backend is available in this checkout), ``MPI.COMM_WORLD.Allreduce`` for mpi4py, and
Gloo's for torchrun. Pass your own with ``--ndist-script`` / ``--mpi-script``.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

NDIST_SCRIPT = """\
import os
import ndist.distributed as dist
if hasattr(dist, "all_reduce") and dist.registered_backends():
    import ndist
    dist.init_process_group()
    t = ndist.ones(1)
    dist.all_reduce(t)
    assert t.item() == dist.get_world_size(), t
    dist.destroy_process_group()
else:  # no collectives in this checkout yet: join the launcher's store and pass a barrier on it
    from ndist.runtime.store import TCPStore
    host, _, port = os.environ["NDIST_STORE"].rpartition(":")
    store = TCPStore(host, int(port), is_master=False)
    if store.add("arrived", 1) == int(os.environ["WORLD_SIZE"]):
        store.set("go", "1")
    store.wait(["go"])
"""

MPI_SCRIPT = """\
import numpy as np
from mpi4py import MPI
a = np.ones(1)
MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, a)
assert a[0] == MPI.COMM_WORLD.Get_size(), a
"""

TORCH_SCRIPT = """\
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == dist.get_world_size()
dist.destroy_process_group()
"""


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _time(cmd: list[str], env: dict, repeats: int, warmup: int) -> tuple[list[float], list[float]]:
    """Wall-clock seconds and CPU seconds (all processes of the run) of each run."""
    wall, cpu = [], []
    for i in range(warmup + repeats):
        c, t = _cpu(), time.perf_counter()
        r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        dt, dc = time.perf_counter() - t, _cpu() - c
        if r.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed with {r.returncode}:\n{r.stderr}")
        if i >= warmup:
            wall.append(dt)
            cpu.append(dc)
    return wall, cpu


def _row(name: str, times: tuple[list[float], list[float]], base: float | None) -> str:
    t, cpu = times
    med = statistics.median(t)
    sd = statistics.stdev(t) if len(t) > 1 else 0.0
    ratio = f"{med / base:6.2f}x" if base else "   1.00x"
    return (f"{name:10s} median {med * 1e3:8.1f} ms  mean {statistics.mean(t) * 1e3:8.1f} ms  "
            f"min {min(t) * 1e3:8.1f} ms  sd {sd * 1e3:6.1f} ms  cpu {statistics.median(cpu) * 1e3:8.1f} ms  {ratio}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--nproc", type=int, default=4)
    p.add_argument("-r", "--repeats", type=int, default=10)
    p.add_argument("-w", "--warmup", type=int, default=1, help="untimed runs first (>= 1 fills the bytecode cache)")
    p.add_argument("--ndist-script", help="script ndistrun runs (default: one all_reduce)")
    p.add_argument("--mpi-script", help="script mpiexec runs (default: one mpi4py Allreduce)")
    p.add_argument("--torchrun", action="store_true", help="also time torchrun (needs torch installed)")
    a = p.parse_args(argv)

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    tmp = tempfile.mkdtemp(prefix="ndist_launch_bench_")
    bytecode = ""
    if env.pop("PYTHONDONTWRITEBYTECODE", None):
        # numpy and mpi4py load from the bytecode in site-packages; without a cache ndist
        # would be compiled from source in every rank of every run. The warm-up run fills
        # a private cache (the checkout gets no __pycache__), as an installed package has.
        env["PYTHONPYCACHEPREFIX"] = os.path.join(tmp, "pycache")
        bytecode = " (PYTHONDONTWRITEBYTECODE ignored: bytecode cached under the temp dir)"
    try:
        def script(given, text, name):
            if given:
                return given
            path = os.path.join(tmp, name)
            with open(path, "w") as f:
                f.write(text)
            return path

        mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""))
        rows = []
        base = None
        if mpiexec:
            cmd = [mpiexec, "-n", str(a.nproc), sys.executable, script(a.mpi_script, MPI_SCRIPT, "mpi_job.py")]
            t = _time(cmd, env, a.repeats, a.warmup)
            base = statistics.median(t[0])
            rows.append(_row("mpiexec", t, None))
        else:
            print("mpiexec not found: timing ndistrun alone")
        cmd = [sys.executable, "-m", "ndist.launch", "--nproc-per-node", str(a.nproc),
               script(a.ndist_script, NDIST_SCRIPT, "ndist_job.py")]
        rows.append(_row("ndistrun", _time(cmd, env, a.repeats, a.warmup), base))
        if a.torchrun:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(a.nproc),
                   script(None, TORCH_SCRIPT, "torch_job.py")]
            rows.append(_row("torchrun", _time(cmd, env, a.repeats, a.warmup), base))
        print(f"{a.nproc} ranks, {a.repeats} runs each after {a.warmup} warm-up, {os.cpu_count()} CPUs{bytecode}")
        print("\n".join(rows))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
