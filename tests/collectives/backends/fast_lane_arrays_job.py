"""A small job over the repeated call in one C call (``_cnative.FastLane``, native/clane.c's
``read_arg``) with arrays other than NumPy's: torch CPU tensors (where torch is installed),
``ndist.Tensor``, an object known only by DLPack and buffer-protocol objects (a memoryview, an
``array.array`` viewing the same bytes); every op it runs, at 16 B to 300 KiB, three
calls each, with checks. Run by hand under valgrind or a sanitizer build (docs/native.md,
"Memory safety")."""

import numpy as np

import ndist
import ndist.distributed as dist
from ndist.runtime import world


class Exported:
    """An array known only by DLPack (``__dlpack__``, ``__dlpack_device__``)."""

    def __init__(self, arr):
        self.arr = arr

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return self.arr.__dlpack__(max_version=max_version) if max_version else self.arr.__dlpack__()

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def wrappers():
    out = {"ndist.Tensor": ndist.from_numpy, "dlpack": Exported, "memoryview": memoryview}
    try:
        import torch
    except ImportError:
        return out
    out["torch"] = torch.from_numpy
    out["torch.nn.Parameter"] = lambda a: torch.nn.Parameter(torch.from_numpy(a), a.dtype.kind == "f")
    return out


def main() -> None:
    dist.init_process_group("socket")
    r, n = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    for name, wrap in wrappers().items():
        for nb in (16 * n, 4096, 300 << 10):
            for _ in range(3):
                rows = nb // 4 // n * n
                a = np.arange(rows, dtype=np.float32) * (r + 1)
                dist.all_reduce(wrap(a))
                assert np.array_equal(a, np.arange(rows, dtype=np.float32) * sum(range(1, n + 1))), name
                b = np.full(rows, r, np.float64)
                dist.broadcast(wrap(b), n - 1)
                assert (b == n - 1).all(), name
                x, y = np.full(rows, r, np.int32), np.empty(rows, np.int32)
                dist.all_to_all_single(wrap(y), wrap(x))
                assert np.array_equal(y, np.repeat(np.arange(n, dtype=np.int32), rows // n)), name
                part, full = np.full(rows // n, r, np.float32), np.empty(rows, np.float32)
                dist.all_gather_into_tensor(wrap(full), wrap(part))
                assert np.array_equal(full, np.repeat(np.arange(n, dtype=np.float32), rows // n)), name
                out = np.empty(rows // n, np.float32)
                dist.reduce_scatter_tensor(wrap(out), wrap(np.full(rows, r + 1, np.float32)))
                assert (out == sum(range(1, n + 1))).all(), name
    kind = type(world.default.fast).__name__
    names = ", ".join(wrappers())
    dist.destroy_process_group()
    print(f"rank {r}: repeated calls on {kind} with {names}, all checks passed")


if __name__ == "__main__":
    main()
