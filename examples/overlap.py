"""Overlapping communication with computation: async all_reduce of gradient buckets.

A backward pass produces gradients bucket by bucket (last layer first). Instead of waiting
for each bucket's all_reduce, launch it with ``async_op=True`` and compute the next bucket
while it is in flight; wait on every Work handle before the optimizer step. This is what
DistributedDataParallel does.

The program checks that both schedules give the same, correct sums in every bucket on every
rank (that is what decides OK), and reports the time each schedule took. The timing is
reported, not checked: overlap pays off when communication has resources that computation
does not use (a network, spare cores); when the ranks' compute and the backend's progress
threads share a few busy cores, overlapping can be slower, and the program says so.

    ndistrun --nproc-per-node 2 examples/overlap.py
"""

import os
import time

import numpy as np

import ndist.distributed as dist

BUCKETS, BUCKET_ELEMS, ROUNDS = 8, 1 << 18, 5
MATRIX = 192  # size of the "backward" matmuls that produce one bucket


def compute_bucket(i, rank, weights):
    """Stand-in for the backward pass of one layer: real work that releases the GIL."""
    a = weights[i]
    for _ in range(4):
        a = np.tanh(a @ weights[i])
    grad = np.resize(a.ravel(), BUCKET_ELEMS).astype(np.float32)
    return grad + np.float32(rank)


def step(rank, weights, overlap):
    grads, works = [], []
    for i in range(BUCKETS):
        g = compute_bucket(i, rank, weights)
        if overlap:
            works.append(dist.all_reduce(g, async_op=True))   # in flight while the next bucket computes
        else:
            dist.all_reduce(g)
        grads.append(g)
    for w in works:
        w.wait()
    return grads


def describe(sync, over):
    """What the timing says, in words: the gain or the loss of overlapping (seconds per step)."""
    diff = sync - over
    if diff >= 0:
        return f"overlap saved {diff * 1e3:.1f} ms per step ({diff / sync * 100:.0f}% faster)"
    return (f"overlap was SLOWER by {-diff * 1e3:.1f} ms per step ({-diff / sync * 100:.0f}% more time); "
            "it pays off only when communication has resources computation does not use")


def main():
    dist.init_process_group()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    rng = np.random.default_rng(7)
    weights = [rng.standard_normal((MATRIX, MATRIX)) / np.sqrt(MATRIX) for _ in range(BUCKETS)]

    timings, results = {}, {}
    for overlap in (False, True, False, True):    # alternate: drift affects both alike
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(ROUNDS):
            grads = step(rank, weights, overlap)
        timings.setdefault(overlap, []).append(time.perf_counter() - t0)
        results[overlap] = grads

    # What decides OK: in every bucket, both schedules give the same sums, and they are the
    # sums of every rank's gradients (each rank can compute every rank's bucket).
    bad = []
    for i in range(BUCKETS):
        expected = sum(compute_bucket(i, r, weights) for r in range(world_size))
        if not np.array_equal(results[False][i], results[True][i]):
            bad.append(f"bucket {i}: the two schedules differ")
        if not np.allclose(results[True][i], expected, rtol=1e-5, atol=1e-4):
            bad.append(f"bucket {i}: wrong sum")
    bad_all = [None] * world_size
    dist.all_gather_object(bad_all, bad)

    if rank == 0:
        sync, over = min(timings[False]) / ROUNDS, min(timings[True]) / ROUNDS
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cores = os.cpu_count()
        print(f"{BUCKETS} buckets x {BUCKET_ELEMS * 4 >> 20} MiB on {world_size} ranks ({cores} cores), per step:")
        print(f"  all_reduce after each bucket  : {sync * 1e3:8.1f} ms")
        print(f"  async, overlapped with compute: {over * 1e3:8.1f} ms")
        print(f"  {describe(sync, over)}")
        if any(bad_all):
            print(f"FAILED: {[(r, b) for r, b in enumerate(bad_all) if b]}")
        else:
            print(f"OK: both schedules give the same, correct sums in all {BUCKETS} buckets on every rank")
    dist.destroy_process_group()
    if any(bad_all):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
