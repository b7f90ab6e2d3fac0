"""A collective that returned is delivered, even when its rank is SIGKILLed right after,
with the Python engine over shared memory (found by CI, 2026-11-27).

A rank writes the payload of a large message (every message with ``NDIST_TRANSPORT=shm``)
into its segment and sends its peers a reference; a peer maps the segment through
``/proc/<owner pid>/fd`` when it reads the first reference to it. A broadcast root used to
return once its references were queued: killed then, its descriptor was gone before a late
reader mapped the segment, and the readers failed the broadcast naming it ("cannot map its
shared memory: process ... holds no such file"). An op that first references a generation
of its segment to a peer now returns once that peer acknowledged reading it; from then on
the peer's mapping keeps the memory alive. Over TCP the kernel's buffers keep it; the native
engine's file is mapped by every peer when it attaches."""

import pytest

from ndist.testing import run_ranks

_SLOW_S = 0.5


def _job(rank, size, op, grow):
    import os
    import signal
    import time

    import numpy as np

    import ndist.distributed as dist
    from ndist.collectives.backends.socket.wire import _segment

    n = (4 << 20) // 8 if grow else 16  # 4 MiB: beyond the first 1 MiB generation
    if grow:  # every rank maps the others' first generation; the grown one is new
        dist.all_reduce(np.ones(16))
        dist.barrier()
    if rank != 0:
        # a reader descheduled between sending its part and mapping rank 0's (a loaded
        # machine): the first reference to rank 0's segment from here on waits a moment
        view, late = _segment.PeerSegments.view, [True]

        def slow_view(self, peer, *args):
            if peer == 0 and late:
                late.clear()
                time.sleep(_SLOW_S)
            return view(self, peer, *args)

        _segment.PeerSegments.view = slow_view
    x = np.full(n, float(rank + 1))
    if op == "all_reduce":
        dist.all_reduce(x)
        want = np.full(n, 6.0)
    else:
        out = np.zeros(size * n)
        dist.all_gather_into_tensor(out, x)
        x, want = out, np.repeat(np.arange(1.0, size + 1), n)
    if rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)  # at once: its result is in, the readers' not yet
    return bool(np.array_equal(x, want))


@pytest.mark.timeout(120)
# (a grown segment's all_reduce is left out: its 4 MiB schedule reads rank 0's segment in an
# earlier step, while rank 0 still waits on the readers, so it does not open the window)
@pytest.mark.parametrize("op, grow", [("all_reduce", False), ("all_gather", False), ("all_gather", True)],
                         ids=["all_reduce-first-generation", "all_gather-first-generation", "all_gather-grown"])
def test_a_collective_whose_rank_is_killed_as_it_returns_completes_on_the_others(op, grow):
    res = run_ranks(_job, 3, args=(op, grow), timeout=60, may_die=[0], transport="shm",
                    env={"NDIST_ENGINE": "python"})
    assert res[0] is None
    assert res[1:] == [True, True], res
