"""Overlapping communication with computation: async all_reduce of gradient buckets.

A backward pass produces gradients bucket by bucket (last layer first). Instead of waiting
for each bucket's all_reduce, launch it with ``async_op=True`` and compute the next bucket
while it is in flight; wait on every Work handle before the optimizer step. This is what
DistributedDataParallel does. The program times both schedules and checks they agree.

    ndistrun --nproc-per-node 2 examples/overlap.py
"""

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


def main():
    dist.init_process_group()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    rng = np.random.default_rng(7)
    weights = [rng.standard_normal((MATRIX, MATRIX)) / np.sqrt(MATRIX) for _ in range(BUCKETS)]

    timings = {}
    for overlap in (False, True, False, True):    # alternate: drift affects both alike
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(ROUNDS):
            grads = step(rank, weights, overlap)
        timings.setdefault(overlap, []).append(time.perf_counter() - t0)

    # Both schedules must give the same, correct sums.
    expected0 = sum(compute_bucket(0, r, weights) for r in range(world_size))
    ok = np.allclose(grads[0], expected0, rtol=1e-5, atol=1e-4)
    ok_all = [None] * world_size
    dist.all_gather_object(ok_all, ok)

    if rank == 0:
        sync, over = min(timings[False]) / ROUNDS, min(timings[True]) / ROUNDS
        print(f"{BUCKETS} buckets x {BUCKET_ELEMS * 4 >> 20} MiB on {world_size} ranks, per step:")
        print(f"  all_reduce after each bucket : {sync * 1e3:8.1f} ms")
        print(f"  async, overlapped with compute: {over * 1e3:8.1f} ms")
        print(f"  time saved: {(sync - over) * 1e3:.1f} ms ({(1 - over / sync) * 100:.0f}%)")
        print("OK: results correct on every rank" if all(ok_all) else f"FAILED: {ok_all}")
    dist.destroy_process_group()
    if not all(ok_all):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
