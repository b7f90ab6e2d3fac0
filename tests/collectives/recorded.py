"""Every public operation once, and what the flight recorder made of it; run by
tests/collectives/test_recorded.py on every backend (``entry``), with and without
``NDIST_DEBUG=DETAIL``, and the mismatches DETAIL must catch (``mismatch_entry``)."""

from __future__ import annotations

import traceback

import numpy as np


def _ops(dist, rank: int, n: int):
    """(public name, callable) of every op; each issues exactly one backend call."""
    f32 = np.float32
    yield "all_reduce", lambda: dist.all_reduce(np.ones(5, f32))
    yield "reduce", lambda: dist.reduce(np.ones(5, f32), dst=0)
    yield "broadcast", lambda: dist.broadcast(np.ones(5, f32), src=n - 1)
    yield "all_gather", lambda: dist.all_gather([np.empty(r + 1, np.int64) for r in range(n)],
                                                np.full(rank + 1, rank, np.int64))
    yield "all_gather_into_tensor", lambda: dist.all_gather_into_tensor(np.empty(3 * n, f32), np.ones(3, f32))
    yield "gather", lambda: dist.gather(np.ones(2, np.int16), [np.empty(2, np.int16) for _ in range(n)]
                                        if rank == 0 else None, dst=0)
    yield "scatter", lambda: dist.scatter(np.empty(2, np.int16), [np.ones(2, np.int16) for _ in range(n)]
                                          if rank == 0 else None, src=0)
    yield "reduce_scatter", lambda: dist.reduce_scatter(np.empty(4, f32), [np.ones(4, f32) for _ in range(n)])
    yield "reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(np.empty(4, f32), np.ones(4 * n, f32))
    yield "all_to_all", lambda: dist.all_to_all([np.empty(2, np.complex64) for _ in range(n)],
                                                [np.ones(2, np.complex64) for _ in range(n)])
    yield "all_to_all_single", lambda: dist.all_to_all_single(np.empty(2 * n, f32), np.ones(2 * n, f32))
    # uneven: rank r sends j + 1 rows to rank j, receives r + 1 from each
    yield "all_to_all_single-uneven", lambda: dist.all_to_all_single(
        np.empty((n * (rank + 1), 2), f32), np.ones((n * (n + 1) // 2, 2), f32),
        [rank + 1] * n, [j + 1 for j in range(n)])
    yield "barrier", lambda: dist.barrier()


def expected(name: str, rank: int, n: int) -> tuple:
    """(recorded op, dtype, count_in, count_out) of public op ``name`` on ``rank`` of ``n``."""
    return {
        "all_reduce": ("all_reduce", "float32", 5, 5),
        "reduce": ("reduce", "float32", 5, 5),
        "broadcast": ("broadcast", "float32", 5, 5),
        "all_gather": ("all_gather", "int64", rank + 1, n * (n + 1) // 2),
        "all_gather_into_tensor": ("all_gather_into", "float32", 3, 3 * n),
        "gather": ("gather", "int16", 2, 2 * n if rank == 0 else 0),
        "scatter": ("scatter", "int16", 2 * n if rank == 0 else 0, 2),
        "reduce_scatter": ("reduce_scatter", "float32", 4 * n, 4),
        "reduce_scatter_tensor": ("reduce_scatter_from", "float32", 4 * n, 4),
        "all_to_all": ("all_to_all", "complex64", 2 * n, 2 * n),
        "all_to_all_single": ("all_to_all_single", "float32", 2 * n, 2 * n),
        "all_to_all_single-uneven": ("all_to_all_single", "float32", n * (n + 1), 2 * n * (rank + 1)),
        "barrier": ("barrier", None, 0, 0),
    }[name]


def entry(rank=None, world_size=None, device="cpu") -> list:
    """Run every op; return ``[name, entry or error]`` per op, in order."""
    import ndist.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    out = []
    for name, op in _ops(dist, rank, n):
        try:
            op()
            e = dist.flight_recorder()[-1]
            out.append([name, {k: e[k] for k in ("op", "dtype", "count_in", "count_out", "state")}])
        except Exception:  # noqa: BLE001 - reported by the test
            out.append([name, traceback.format_exc()])
    if n > 1:  # p2p is recorded too, numbered apart
        buf = np.arange(3.0)
        if rank == 0:
            dist.send(buf, dst=1)
        elif rank == 1:
            dist.recv(buf, src=0)
        if rank < 2:
            e = dist.flight_recorder()[-1]
            out.append(["p2p", {k: e[k] for k in ("op", "dtype", "count_in", "count_out", "state")}])
        dist.barrier()  # (delivery of a send before the sender exits is tests/reliability's subject)
    return out


def mismatch_entry(rank=None, world_size=None, device="cpu") -> list:
    """Rank 0 calls each op with other counts than the rest: with NDIST_DEBUG=DETAIL every
    rank must raise DistMismatchError before the backend sees the call; then a matched op works."""
    import ndist.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    k = 3 if rank == 0 else 2
    cases = {
        "all_reduce": lambda: dist.all_reduce(np.ones(k)),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(np.empty(k * n), np.ones(k)),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(np.empty(k), np.ones(k * n)),
        "all_to_all_single": lambda: dist.all_to_all_single(np.empty(k * n), np.ones(k * n)),
    }
    out = {}
    for name, call in cases.items():
        try:
            call()
            out[name] = "no error"
        except dist.DistMismatchError as err:
            out[name] = "DistMismatchError: " + str(err)
        except Exception as err:  # noqa: BLE001
            out[name] = f"{type(err).__name__}: {err}"
        x = np.ones(2)
        dist.all_reduce(x)  # the group is still usable
        if not (x == n).all():
            out[name] += f"; the next all_reduce gave {x}"
    return out
