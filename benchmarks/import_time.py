"""Time ``import ndist`` in fresh interpreters (target: < 0.3 s), next to ``import numpy``.

    python benchmarks/import_time.py [repeats]
"""

import statistics
import subprocess
import sys

CODE = "import time; t = time.perf_counter(); import {mod}; print(time.perf_counter() - t)"


def measure(mod: str, repeats: int) -> list[float]:
    return [
        float(subprocess.run([sys.executable, "-c", CODE.format(mod=mod)], capture_output=True,
                             text=True, check=True).stdout)
        for _ in range(repeats)
    ]


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 11
    for mod in ("numpy", "ndist"):
        t = measure(mod, n)
        print(f"import {mod:6s} median {statistics.median(t) * 1e3:7.1f} ms  min {min(t) * 1e3:7.1f} ms  (n={n})")
