"""ndist.Tensor overhead vs. the same NumPy call, on 1M float32 elements.

Run: ``python benchmarks/tensor_ops.py [--n 1000000] [--repeat 31]``. Prints, per op,
the median time of ndist and of NumPy and their ratio (goal: <= 1.2).
Not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import timeit

import numpy as np

import ndist


def _steady_malloc() -> bool:
    """Ask glibc to keep freed multi-MB blocks instead of unmapping them, so each fresh
    1M-element result is not a new mmap + page faults; otherwise timings of ops that
    allocate are bimodal (150 us vs 1 ms) and the comparison measures the kernel."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_mmap_threshold, 1 << 28) and
                    libc.mallopt(m_trim_threshold, 1 << 28))
    except (OSError, AttributeError):
        return False


def _paired(nd, npf, number: int, repeat: int) -> tuple[float, float, float, float]:
    """Median seconds per call of ``nd`` and ``npf``, timed in alternating pairs so that
    load from other processes hits both alike; the median of the per-pair ratios; and
    the ratio of the minima (the least noisy estimate on a busy machine)."""
    t_nd, t_np, ratios = [], [], []
    for _ in range(repeat):
        x = timeit.timeit(nd, number=number) / number
        y = timeit.timeit(npf, number=number) / number
        t_nd.append(x)
        t_np.append(y)
        ratios.append(x / y)
    return (statistics.median(t_nd), statistics.median(t_np), statistics.median(ratios),
            min(t_nd) / min(t_np))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="elements per tensor")
    ap.add_argument("--repeat", type=int, default=31, help="timeit repeats (median is reported)")
    ap.add_argument("--number", type=int, default=10, help="calls per timeit repeat")
    args = ap.parse_args()

    steady = _steady_malloc()
    rng = np.random.default_rng(0)
    # values near 1 keep prod() finite and free of denormals
    a = (1 + rng.random(args.n, dtype=np.float32) * 1e-6).astype(np.float32)
    b = rng.random(args.n, dtype=np.float32) + 0.5
    ta, tb = ndist.from_numpy(a), ndist.from_numpy(b)
    ops = [
        ("a + b", lambda: ta + tb, lambda: a + b),
        ("a - b", lambda: ta - tb, lambda: a - b),
        ("a * b", lambda: ta * tb, lambda: a * b),
        ("a / b", lambda: ta / tb, lambda: a / b),
        ("a * 2.5", lambda: ta * 2.5, lambda: a * np.float32(2.5)),
        ("a > b", lambda: ta > tb, lambda: a > b),
        ("-a", lambda: -ta, lambda: -a),
        ("a += b", lambda: ta.__iadd__(tb), lambda: np.add(a, b, out=a)),
        ("a.sum()", lambda: ta.sum(), lambda: a.sum()),
        ("a.mean()", lambda: ta.mean(), lambda: a.mean()),
        ("a.max()", lambda: ta.max(), lambda: a.max()),
        ("a.min()", lambda: ta.min(), lambda: a.min()),
        ("a.prod()", lambda: ta.prod(), lambda: a.prod()),
    ]
    print(f"{args.n} float32 elements, median of {args.repeat} alternating pairs of "
          f"{args.number} calls{'' if steady else ' (glibc mallopt unavailable: allocations vary)'}")
    print(f"{'op':10} {'ndist us':>10} {'numpy us':>10} {'ratio':>7} {'min-ratio':>9}")
    worst = 0.0
    for name, nd, npf in ops:
        nd(), npf()  # warm up
        tn, tp, ratio, min_ratio = _paired(nd, npf, args.number, args.repeat)
        worst = max(worst, ratio)
        print(f"{name:10} {tn * 1e6:10.1f} {tp * 1e6:10.1f} {ratio:7.2f} {min_ratio:9.2f}")
    print(f"worst median ratio {worst:.2f}")


if __name__ == "__main__":
    main()
