"""Elastic data-parallel training: a rank dies, the survivors shrink the group, and with
``--heal`` admit its replacement and grow back; every rank finishes with the same weights.

A small NumPy MLP is trained with mini-batch gradient descent on 4 ranks. Each step every
rank takes ``PER_RANK`` samples of that step's batch, so the batch of a step depends on how
many ranks take part in it: step ``t`` uses the first ``PER_RANK * world_size`` samples of a
permutation drawn from seed ``t``, rank ``r`` the ``r``-th slice of ``PER_RANK`` of them.
The gradients (and the loss, in the same buffer) are summed with one ``all_reduce`` and
divided by the batch size.

    ndistrun --nproc-per-node 4 --on-failure continue examples/elastic_training.py --kill-rank 2 --kill-step 5

Rank ``--kill-rank`` SIGKILLs itself at the start of step ``--kill-step`` (before its
all_reduce). The survivors' all_reduce of that step raises ``DistRankFailureError``; each
survivor calls ``dist.shrink_group()`` (the survivors agree on who is gone and become the new
default group, renumbered 0..n-1) and carries on with the re-split batches.

**The interrupted step is redone by the survivors.** A step counts only once every survivor
has completed it. After a shrink, the survivors take the minimum of the steps each completed
(one ``all_reduce(MIN)`` on the shrunk group); a survivor that had completed one step more (a
loss in the middle of an all_reduce can let some ranks finish it and not others) rolls back
to its weights before that step, and all redo it at the new world size. With a self-kill at
the start of step K nobody completes step K, so the schedule is ``K`` steps on 4 ranks, then
the remaining ``STEPS - K`` (step K included) on 3.

**Healing** (``--heal``, under ``ndistrun --on-failure replace``): the launcher starts a new
process in the dead rank's place. Its ``init_process_group()`` returns once the survivors admit
it, and ``dist.joined_running_job()`` tells it it joined a running job. The survivors call
``dist.grow_group()`` at every step boundary while the group is smaller than at the start
(nobody waiting: one round trip through the store); from step ``--heal-by`` on they wait for
the newcomer. The grow numbers the survivors first, the newcomer last; rank 0 then sends the
newcomer the weights, the step and the schedule so far (``broadcast_object_list``), and all go
on at the full size: 4 -> 3 -> 4 ranks.

    ndistrun --nproc-per-node 4 --on-failure replace examples/elastic_training.py --kill-rank 2 --kill-step 5 --heal

At the end every rank replays the recorded schedule (each step's seed and world size) in
one process on the whole batch of each step, checks that its weights match to 1e-9, that the
schedule is the expected one, and that the loss went down; it prints the world sizes the job
went through and OK, or exits 1.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import numpy as np

import ndist.distributed as dist

SAMPLES, FEATURES, HIDDEN = 960, 8, 16
PER_RANK, STEPS, LR = 24, 40, 0.2
WORLD = 4


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


NAMES = ["w1", "b1", "w2", "b2"]


def batch(step: int, world_size: int) -> np.ndarray:
    """The sample indices of ``step`` when ``world_size`` ranks take part in it."""
    return np.random.default_rng([7, step]).permutation(SAMPLES)[:PER_RANK * world_size]


def shard(step: int, world_size: int, rank: int) -> np.ndarray:
    return batch(step, world_size)[rank * PER_RANK:(rank + 1) * PER_RANK]


def grad_sums(p, x, y) -> np.ndarray:
    """This slice's sums of squared error and of its gradients: one flat buffer, the loss last."""
    h = np.tanh(x @ p["w1"] + p["b1"])
    diff = h @ p["w2"] + p["b2"] - y
    d_pred = 2 * diff
    d_h = (d_pred @ p["w2"].T) * (1 - h ** 2)
    grads = {"w1": x.T @ d_h, "b1": d_h.sum(0), "w2": h.T @ d_pred, "b2": d_pred.sum(0)}
    return np.concatenate([grads[k].ravel() for k in NAMES] + [[float((diff ** 2).sum())]])


def apply(p, summed: np.ndarray, batch_size: int) -> float:
    """One update from the summed buffer; returns the step's mean loss."""
    offset = 0
    for k in NAMES:
        n = p[k].size
        p[k] -= LR * summed[offset:offset + n].reshape(p[k].shape) / batch_size
        offset += n
    return float(summed[-1]) / batch_size


def replay(x, y, schedule: list[int]):
    """Single process: step ``t`` on the whole batch that ``schedule[t]`` ranks shared."""
    p, losses = init_params(), []
    for step, world_size in enumerate(schedule):
        idx = batch(step, world_size)
        losses.append(apply(p, grad_sums(p, x[idx], y[idx]), len(idx)))
    return p, losses


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kill-rank", type=int, default=None, help="the rank (at start) that SIGKILLs itself")
    ap.add_argument("--kill-step", type=int, default=None, help="... at the start of this step")
    ap.add_argument("--heal", action="store_true", help="admit the replacement (ndistrun --on-failure replace)")
    ap.add_argument("--heal-by", type=int, default=30, help="with --heal: from this step on, wait for the newcomer")
    a = ap.parse_args(argv)

    dist.init_process_group()
    joined = dist.joined_running_job()  # started in a lost rank's place, admitted by the survivors
    start_rank, start_size = dist.get_rank(), int(os.environ.get("WORLD_SIZE", dist.get_world_size()))
    if a.kill_step is not None and not 0 <= a.kill_step < STEPS:
        raise SystemExit(f"--kill-step: expected a step in [0, {STEPS}), got {a.kill_step}")
    if a.kill_rank is not None and not 0 <= a.kill_rank < start_size:
        raise SystemExit(f"--kill-rank: expected a rank in [0, {start_size}), got {a.kill_rank}")
    x, y = dataset()
    params, before = init_params(), None
    schedule: list[int] = []  # world size of each completed step
    losses: list[float] = []
    sizes = [dist.get_world_size()]  # the world sizes the job went through
    shrinks = 0

    step = 0
    if joined:  # the state of the running job, from rank 0
        try:
            params, before, step, schedule, losses, sizes = receive_state()
        except dist.DistRankFailureError as err:  # a member was lost before the state came: recover with the others
            print(f"lost ranks {err.failed_ranks} before the state came; shrinking", flush=True)
            params, before, step, schedule, losses, sizes = recover(None, None, None, [], [], [], heal=True)
        print(f"joined the running job as rank {dist.get_rank()} of {dist.get_world_size()} at step {step} "
              f"(replacing rank {os.environ.get('NDIST_REPLACES')})", flush=True)
    while True:
        if a.heal:  # a step boundary (the last too): admit newcomers while the group is short
            params, before, step, schedule, losses, sizes, lost = heal(a, start_size, params, before, step, schedule,
                                                                       losses, sizes)
            shrinks += lost
        if step >= STEPS:
            break
        if not joined and start_rank == a.kill_rank and step == a.kill_step:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        rank, world_size = dist.get_rank(), dist.get_world_size()
        idx = shard(step, world_size, rank)
        buf = grad_sums(params, x[idx], y[idx])
        try:
            dist.all_reduce(buf)
        except dist.DistRankFailureError as err:
            print(f"step {step}: lost ranks {err.failed_ranks} ({', '.join(err.causes)}) of {world_size}; "
                  "shrinking", flush=True)
            params, before, step, schedule, losses, sizes = recover(step, params, before, schedule, losses, sizes,
                                                                    heal=a.heal)
            shrinks += 1
            continue
        before = {k: v.copy() for k, v in params.items()}
        losses.append(apply(params, buf, PER_RANK * world_size))
        schedule.append(world_size)
        step += 1

    rank, world_size = dist.get_rank(), dist.get_world_size()
    single, single_losses = replay(x, y, schedule)
    diff = max(float(np.abs(params[k] - single[k]).max()) for k in NAMES)
    print(f"rank {start_rank} -> {rank} of {world_size} after {shrinks} shrink(s); steps per world size: "
          f"{ {w: schedule.count(w) for w in sorted(set(schedule), reverse=True)} }; loss {losses[0]:.4f} -> "
          f"{losses[-1]:.4f}; max |weight difference| vs the single-process replay: {diff:.2e}", flush=True)
    checks = {"schedule as expected": expected(schedule, a, start_size, sizes),
              "same weights as the replay": diff < 1e-9,
              "same losses as the replay": np.allclose(losses, single_losses, rtol=1e-9, atol=0),
              "loss went down": losses[-1] < losses[0] / 2}
    if a.heal and a.kill_rank is not None:  # (a second loss: 4 -> 3 -> ... -> 4)
        checks["healed: 4 -> 3 -> 4 ranks"] = (sizes[:2] == [start_size, start_size - 1] and sizes[-1] == start_size
                                               and (len(sizes) == 3 or min(sizes) >= start_size - 2))
    failed = [name for name, ok in checks.items() if not ok]
    if failed:
        print(f"FAILED: {', '.join(failed)} (schedule {schedule}, world sizes {sizes})", flush=True)
        return 1
    print(f"world sizes: {' -> '.join(map(str, sizes))}", flush=True)
    if a.heal:
        print("OK: every rank finished with the weights of the single-process replay", flush=True)
    else:
        print("OK: survivors finished with the weights of the single-process replay", flush=True)
    dist.destroy_process_group()
    return 0


def expected(schedule: list[int], a, start_size: int, sizes: list[int]) -> bool:
    """Without a loss: every step on ``start_size`` ranks. A loss at step K: K steps on all, then
    (the interrupted step redone) the rest on one fewer, or with ``--heal`` some (maybe none:
    the newcomer came before the redone step) on one fewer and the rest on all again, once the
    newcomer was admitted; a second loss (``sizes`` went lower or more than once down) may
    put any later step on one or two fewer."""
    if a.kill_step is None or a.kill_rank is None:
        return schedule == [start_size] * STEPS
    k = a.kill_step
    if not a.heal:
        return schedule == [start_size] * k + [start_size - 1] * (STEPS - k)
    if len(schedule) != STEPS or schedule[:k] != [start_size] * k:
        return False
    if len(sizes) == 3:  # one loss, one grow
        short = schedule[k:].count(start_size - 1)
        return schedule == [start_size] * k + [start_size - 1] * short + [start_size] * (STEPS - k - short)
    return all(start_size - 2 <= w <= start_size for w in schedule[k:])


def heal(a, start_size, params, before, step, schedule, losses, sizes):
    """While the group is smaller than at the start: admit the newcomers waiting (from step
    ``--heal-by`` on, and at the end, wait for one), and send them the state. A member lost
    during the grow: shrink and resume (``recover``: every member, a newcomer that lost a
    member before the state came too, then comes here), then try again. Returns the state
    (its step may be one earlier: a step to redo) and the number of losses met."""
    lost = 0
    while dist.get_world_size() < start_size:
        try:
            grown = grow(wait=step >= a.heal_by)
            if not grown:
                break
            sizes.append(dist.get_world_size())
            print(f"step {step}: admitted ranks {grown}; the world has {dist.get_world_size()} ranks", flush=True)
            send_state(params, before, step, schedule, losses, sizes)
        except dist.DistRankFailureError as err:  # a member lost during the grow: shrink, grow again
            print(f"step {step}: lost ranks {err.failed_ranks} during the grow; shrinking", flush=True)
            params, before, step, schedule, losses, sizes = recover(step, params, before, schedule, losses, sizes,
                                                                    heal=True)
            lost += 1
    return params, before, step, schedule, losses, sizes, lost


def grow(wait: bool) -> list[int]:
    """Admit the processes waiting to join (their new ranks); with ``wait``, until one came."""
    deadline = time.monotonic() + 60
    while True:
        grown = dist.grow_group()
        if grown or not wait:
            return grown
        if time.monotonic() > deadline:
            raise RuntimeError("no replacement came within 60 s (run under ndistrun --on-failure replace)")
        time.sleep(0.02)


def send_state(params, before, step, schedule, losses, sizes) -> None:
    """Rank 0 sends the newcomers what they need to go on (the others pass None)."""
    state = [(params, before, step, schedule, losses, sizes)] if dist.get_rank() == 0 else [None]
    dist.broadcast_object_list(state, src=0)


def receive_state():
    state = [None]
    dist.broadcast_object_list(state, src=0)
    params, before, step, schedule, losses, sizes = state[0]
    return params, before, step, list(schedule), list(losses), list(sizes)


def recover(step, params, before, schedule, losses, sizes, heal=False):
    """Shrink, then agree on the first step that not every survivor completed, and resume
    there (rolling back the one step this rank may have completed beyond it). With ``heal``,
    rank 0 (a survivor: they keep the lowest ranks) then sends the state to every member: a
    newcomer the grow admitted may not have it yet (``step`` None: a newcomer that lost a
    member before the state came takes part, and receives it). Returns the new state."""
    dist.shrink_group()  # the survivors agree on who is lost; the new default group
    mine = len(schedule) if step is not None else STEPS + 1  # (a newcomer without the state: not counted)
    while True:
        done = np.array([mine], dtype=np.int64)
        try:
            dist.all_reduce(done, op=dist.ReduceOp.MIN)
            state = resumed(int(done[0]), step, params, before, schedule, losses, sizes)
            if heal:  # every member takes rank 0's state of the resumed step
                sent = [state] if dist.get_rank() == 0 else [None]
                dist.broadcast_object_list(sent, src=0)
                state = sent[0]
            break
        except dist.DistRankFailureError:  # another loss, learnt on the shrunk group
            dist.shrink_group()
    if state[2] is None:
        raise RuntimeError("rank 0 of the shrunk group had no state to send")
    params, before, step, schedule, losses, sizes = state
    return params, before, step, list(schedule), list(losses), list(sizes)


def resumed(resume, step, params, before, schedule, losses, sizes):
    """This rank's state at step ``resume`` (the agreed one) on the group it is in now."""
    if step is None:  # (a newcomer without the state)
        return None, None, None, [], [], []
    if resume == step - 1:  # this rank completed a step that another survivor did not: redo it
        params, schedule, losses = before, schedule[:resume], losses[:resume]
    elif resume != step:
        raise RuntimeError(f"survivors disagree by more than one step: this rank at {step}, resume at {resume}")
    return params, before, resume, list(schedule), list(losses), sizes + [dist.get_world_size()]


if __name__ == "__main__":
    sys.exit(main())
