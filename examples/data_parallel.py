"""Data-parallel training of a small NumPy MLP: gradients averaged with all_reduce.

Every rank holds the same model and a shard of a synthetic regression set. Each step it
computes the gradient on its shard, the gradients are averaged with one all_reduce over a
flat bucket, and every rank applies the same update. Because the shards are equal and the
loss is a mean, this is exactly full-batch training: at the end rank 0 trains the same model
in one process on the whole set and checks that the weights agree.

    ndistrun --nproc-per-node 2 examples/data_parallel.py
"""

import numpy as np

import ndist
import ndist.distributed as dist

SAMPLES, FEATURES, HIDDEN = 512, 8, 32
STEPS, LR = 600, 0.1


def dataset():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((SAMPLES, FEATURES))
    w = rng.standard_normal(FEATURES) / np.sqrt(FEATURES)
    y = np.sin(2 * x @ w)[:, None] + 0.05 * rng.standard_normal((SAMPLES, 1))
    return x, y


def init_params():
    rng = np.random.default_rng(42)
    return {
        "w1": rng.standard_normal((FEATURES, HIDDEN)) / np.sqrt(FEATURES),
        "b1": np.zeros(HIDDEN),
        "w2": rng.standard_normal((HIDDEN, 1)) / np.sqrt(HIDDEN),
        "b2": np.zeros(1),
    }


def loss_and_grads(p, x, y, n_total):
    """Mean-squared error over ``n_total`` samples; this shard's share of loss and gradients."""
    h = np.tanh(x @ p["w1"] + p["b1"])
    pred = h @ p["w2"] + p["b2"]
    diff = pred - y
    loss = float((diff ** 2).sum() / n_total)
    d_pred = 2 * diff / n_total
    d_h = (d_pred @ p["w2"].T) * (1 - h ** 2)
    grads = {"w1": x.T @ d_h, "b1": d_h.sum(0), "w2": h.T @ d_pred, "b2": d_pred.sum(0)}
    return loss, grads


def train(x, y, steps, allreduce=None):
    """Gradient descent; ``allreduce(flat)`` sums a flat float64 buffer over ranks (or None)."""
    params, losses = init_params(), []
    names = list(params)
    sizes = [params[k].size for k in names]
    bucket = np.empty(sum(sizes))                     # one flat gradient bucket, reused
    for _ in range(steps):
        loss, grads = loss_and_grads(params, x, y, SAMPLES)
        np.concatenate([grads[k].ravel() for k in names], out=bucket)
        stats = np.array([loss])
        if allreduce is not None:
            allreduce(bucket)                         # sum of the shards' gradients
            allreduce(stats)                          # and of their losses
        offset = 0
        for k, n in zip(names, sizes):
            params[k] -= LR * bucket[offset:offset + n].reshape(params[k].shape)
            offset += n
        losses.append(float(stats[0]))
    return params, losses


def main():
    dist.init_process_group()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if SAMPLES % world_size:
        raise SystemExit(f"{SAMPLES} samples do not split evenly over {world_size} ranks")
    x, y = dataset()
    shard = slice(rank * SAMPLES // world_size, (rank + 1) * SAMPLES // world_size)

    # ndist collectives take NumPy arrays directly (no copy); Tensors work the same way.
    params, losses = train(x[shard], y[shard], STEPS, allreduce=lambda buf: dist.all_reduce(buf))

    if rank == 0:
        for step in (0, 99, 199, 399, STEPS - 1):
            print(f"step {step + 1:4d}  loss {losses[step]:.4f}")
        single, single_losses = train(x, y, STEPS)
        diff = max(float(np.abs(params[k] - single[k]).max()) for k in params)
        print(f"max |weight difference| vs single-process full-batch training: {diff:.2e}")
        converged = losses[-1] < losses[0] / 10
        same = diff < 1e-9 and abs(losses[-1] - single_losses[-1]) < 1e-9
        print("OK: converged, same weights as single-process training" if converged and same
              else f"FAILED: converged={converged} same={same}")
        if not (converged and same):
            raise SystemExit(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
