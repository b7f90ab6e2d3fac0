"""Which of ndist's files one collective call runs code in (docs/architecture.md,
"One call, by hand"): every rank's ``{op: {"repeated": [...], "first": [...]}}``.

``first`` is a blocking call on fresh buffers, ``repeated`` the third call with
the same arguments: both take the repeated-call path once the group ran one
collective, so both cross the same files. A file
counts when a Python function defined in it is called (``sys.setprofile``);
paths are relative to the ``ndist`` package.
"""

from __future__ import annotations

import sys

import numpy as np


def _files(fn) -> list[str]:
    seen: list[str] = []

    def hook(frame, event, arg):
        if event == "call":
            path = frame.f_code.co_filename.replace("\\", "/")
            if "/ndist/" in path:
                rel = path.rsplit("/ndist/", 1)[1]
                if rel not in seen:
                    seen.append(rel)

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def _ops(dist, r, n):
    def a2a_even():
        out, inp = np.empty(8 * n, np.float32), np.full(8 * n, r, np.float32)
        return lambda: dist.all_to_all_single(out, inp)

    def a2a_uneven():
        sizes = [j + 1 for j in range(n)]
        out, inp = np.empty((r + 1) * n, np.float32), np.full(sum(sizes), r, np.float32)
        return lambda: dist.all_to_all_single(out, inp, [r + 1] * n, sizes)

    def all_gather_into():
        out, inp = np.empty(8 * n, np.float32), np.full(8, r, np.float32)
        return lambda: dist.all_gather_into_tensor(out, inp)

    def all_reduce():
        buf = np.ones(8, np.float32)
        return lambda: dist.all_reduce(buf)

    return {"all_to_all_single even": a2a_even, "all_to_all_single uneven": a2a_uneven,
            "all_gather_into_tensor": all_gather_into, "all_reduce": all_reduce}


def entry(rank=None, world_size=None, device="cpu") -> dict:
    import ndist.distributed as dist

    r, n = dist.get_rank(), dist.get_world_size()
    dist.all_reduce(np.ones(1, np.float32))  # the group's first collective: links and lanes set up
    result = {}
    for name, make in _ops(dist, r, n).items():
        first = _files(make())
        call = make()
        call()
        call()
        result[name] = {"first": first, "repeated": _files(call)}
    from ndist.collectives import get_engine

    result["engine"] = get_engine()
    return result
