"""Point-to-point on a ring: a hand-written ring all-reduce and a micro-batch pipeline.

Part 1 sums a vector over all ranks the way ring all-reduce does it: the vector is cut
into world_size chunks; in world_size - 1 steps every rank sends one chunk to its right
neighbour and adds the chunk arriving from its left (reduce-scatter), then passes the
finished chunks around once more (all-gather). Each step posts its send and receive
together with ``batch_isend_irecv``, so no ordering can deadlock. The result is checked
against ``dist.all_reduce``.

Part 2 runs a pipeline: rank r is stage r of a model; micro-batches flow from stage to
stage with blocking ``send``/``recv``, and the last stage returns results to rank 0, which
closes the ring and checks them against the whole model applied in one process.

    ndistrun --nproc-per-node 4 examples/ring_pipeline.py
"""

import numpy as np

import ndist
import ndist.distributed as dist

N = 1 << 12
MICRO_BATCHES, BATCH, WIDTH = 6, 8, 16


def ring_all_reduce(vec, rank, world_size):
    chunks = list(vec.chunk(world_size))        # views: updated in place
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    incoming = ndist.empty(chunks[0].numel(), dtype=vec.dtype)
    # reduce-scatter: after step s, chunk (rank - s - 1) holds s + 2 contributions
    for s in range(world_size - 1):
        send_idx, recv_idx = (rank - s) % world_size, (rank - s - 1) % world_size
        buf = incoming[: chunks[recv_idx].numel()]
        ops = [dist.P2POp(dist.isend, chunks[send_idx], right), dist.P2POp(dist.irecv, buf, left)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        chunks[recv_idx] += buf
    # all-gather: pass the finished chunks around the ring
    for s in range(world_size - 1):
        send_idx, recv_idx = (rank + 1 - s) % world_size, (rank - s) % world_size
        ops = [dist.P2POp(dist.isend, chunks[send_idx], right), dist.P2POp(dist.irecv, chunks[recv_idx], left)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
    return vec


def stage_weights(world_size):
    rng = np.random.default_rng(3)
    return [(rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32) for _ in range(world_size)]


def pipeline(rank, world_size):
    weights = stage_weights(world_size)
    last = world_size - 1
    buf = ndist.empty((BATCH, WIDTH), dtype=ndist.float32)
    results = []
    for m in range(MICRO_BATCHES):
        if rank == 0:
            x = ndist.from_numpy(np.random.default_rng(100 + m).standard_normal((BATCH, WIDTH)).astype(np.float32))
        else:
            dist.recv(buf, src=rank - 1)
            x = buf
        y = ndist.from_numpy(np.tanh(x.numpy() @ weights[rank]))
        if rank < last:
            dist.send(y, dst=rank + 1)
        elif last != 0:
            dist.send(y, dst=0)                 # close the ring: results go back to rank 0
        if rank == 0:
            if last != 0:
                out = ndist.empty((BATCH, WIDTH), dtype=ndist.float32)
                dist.recv(out, src=last)
                y = out
            results.append(y.numpy().copy())
    if rank != 0:
        return True
    ok = True
    for m, got in enumerate(results):
        x = np.random.default_rng(100 + m).standard_normal((BATCH, WIDTH)).astype(np.float32)
        for w in weights:
            x = np.tanh(x @ w)
        ok &= np.allclose(got, x, atol=1e-5)
    return ok


def main():
    dist.init_process_group()
    rank, world_size = dist.get_rank(), dist.get_world_size()

    vec = ndist.arange(N, dtype=ndist.float32) * (rank + 1)
    mine = ring_all_reduce(vec.clone(), rank, world_size)
    ref = vec.clone()
    dist.all_reduce(ref)
    ring_ok = bool(ndist.equal(mine, ref))

    pipe_ok = pipeline(rank, world_size)
    oks = [None] * world_size
    dist.all_gather_object(oks, (ring_ok, pipe_ok))
    if rank == 0:
        print(f"ring all-reduce of {N} floats on {world_size} ranks: "
              f"{'matches dist.all_reduce' if all(o[0] for o in oks) else 'MISMATCH'}")
        print(f"pipeline of {world_size} stages, {MICRO_BATCHES} micro-batches: "
              f"{'matches the single-process model' if pipe_ok else 'MISMATCH'}")
        print("OK" if all(o[0] and o[1] for o in oks) else "FAILED")
    dist.destroy_process_group()
    if not (ring_ok and pipe_ok):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
