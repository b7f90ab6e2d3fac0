"""Mixture-of-experts token routing with uneven all_to_all_single.

Every rank owns ``EXPERTS_PER_RANK`` experts and a batch of tokens. A gate scores each token
against every expert; each token goes to its best expert, wherever that expert lives:

1. route:    sort local tokens by destination rank, count how many go to each rank;
2. counts:   exchange the counts (all_to_all_single on a length-world_size tensor), so each
             rank learns how many tokens it will receive from each peer;
3. dispatch: send the tokens (and their expert ids) with uneven all_to_all_single;
4. experts:  apply each local expert to the tokens it received;
5. combine:  send the results back with the inverse exchange (splits swapped) and undo the sort.

The result is checked against a single-process computation of the same model.

    ndistrun --nproc-per-node 4 examples/moe_dispatch.py
"""

import numpy as np

import ndist
import ndist.distributed as dist

TOKENS_PER_RANK = 64
DIM = 16
EXPERTS_PER_RANK = 2


def make_model(num_experts):
    """Gate and expert weights; the same on every rank (same seed)."""
    rng = np.random.default_rng(1234)
    gate = rng.standard_normal((DIM, num_experts)).astype(np.float32)
    experts = (rng.standard_normal((num_experts, DIM, DIM)) / np.sqrt(DIM)).astype(np.float32)
    return gate, experts


def expert_forward(experts, expert_id, x):
    return np.tanh(x @ experts[expert_id])


def moe_layer(tokens, gate, experts, rank, world_size):
    """Route ``tokens`` (T x DIM) to their experts across ranks and back."""
    scores = tokens @ gate                                    # T x E
    probs = np.exp(scores - scores.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    expert_of_token = probs.argmax(axis=1)                    # top-1 routing
    weight_of_token = probs[np.arange(len(tokens)), expert_of_token]

    # 1. route: group tokens by destination rank.
    dest_rank = expert_of_token // EXPERTS_PER_RANK
    order = np.argsort(dest_rank, kind="stable")
    send_tokens = ndist.from_numpy(np.ascontiguousarray(tokens[order]))
    send_experts = ndist.from_numpy(expert_of_token[order].astype(np.int64))
    input_splits = np.bincount(dest_rank, minlength=world_size).astype(np.int64)

    # 2. counts: rank i learns how many tokens each peer sends it.
    send_counts = ndist.from_numpy(input_splits)
    recv_counts = ndist.empty(world_size, dtype=ndist.int64)
    dist.all_to_all_single(recv_counts, send_counts)
    output_splits = recv_counts.tolist()
    input_splits = input_splits.tolist()

    # 3. dispatch: uneven exchange of the tokens and of their expert ids.
    n_recv = sum(output_splits)
    recv_tokens = ndist.empty((n_recv, DIM), dtype=ndist.float32)
    recv_experts = ndist.empty(n_recv, dtype=ndist.int64)
    work = dist.all_to_all_single(recv_experts, send_experts, output_splits, input_splits, async_op=True)
    dist.all_to_all_single(recv_tokens, send_tokens, output_splits, input_splits)
    work.wait()

    # 4. experts: each local expert processes the tokens it received.
    x, ids = recv_tokens.numpy(), recv_experts.numpy()
    y = np.empty_like(x)
    for e in range(rank * EXPERTS_PER_RANK, (rank + 1) * EXPERTS_PER_RANK):
        mask = ids == e
        y[mask] = expert_forward(experts, e, x[mask])

    # 5. combine: the inverse exchange (splits swapped), then undo the sort.
    back = ndist.empty((len(tokens), DIM), dtype=ndist.float32)
    dist.all_to_all_single(back, ndist.from_numpy(y), input_splits, output_splits)
    out = np.empty_like(tokens)
    out[order] = back.numpy()
    return out * weight_of_token[:, None], input_splits, output_splits


def reference(tokens, gate, experts):
    """The same layer in one process: every token through its expert, no communication."""
    scores = tokens @ gate
    probs = np.exp(scores - scores.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    best = probs.argmax(axis=1)
    out = np.stack([expert_forward(experts, e, t) for e, t in zip(best, tokens)])
    return out * probs[np.arange(len(tokens)), best][:, None]


def main():
    dist.init_process_group()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    gate, experts = make_model(world_size * EXPERTS_PER_RANK)
    tokens = np.random.default_rng(rank).standard_normal((TOKENS_PER_RANK, DIM)).astype(np.float32)

    out, sent, received = moe_layer(tokens, gate, experts, rank, world_size)
    err = float(np.abs(out - reference(tokens, gate, experts)).max())

    # Gather a summary on rank 0 with an object collective.
    summary = [None] * world_size
    dist.all_gather_object(summary, {"rank": rank, "sent": sent, "received": received, "err": err})
    if rank == 0:
        print(f"MoE layer: {world_size} ranks x {EXPERTS_PER_RANK} experts, {TOKENS_PER_RANK} tokens per rank")
        for s in summary:
            print(f"  rank {s['rank']}: sent {s['sent']}  received {s['received']}  max |error| {s['err']:.2e}")
        worst = max(s["err"] for s in summary)
        print("OK: matches the single-process computation" if worst < 1e-5 else f"MISMATCH: {worst}")
    dist.destroy_process_group()
    if err >= 1e-5:
        raise SystemExit(f"rank {rank}: result differs from the single-process computation by {err}")


if __name__ == "__main__":
    main()
