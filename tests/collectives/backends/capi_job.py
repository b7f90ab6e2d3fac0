"""A small job over the engine's C interface: ``capi_test.c`` (built here with the system C
compiler) on the world group, from a thread of its own, then calls through ctypes mixed with
``ndist.distributed``'s. Run by hand under valgrind or a sanitizer build (docs/native.md,
"Memory safety"): ``ndistrun --nproc-per-node 2 -m tests.collectives.backends.capi_job``."""

import pathlib
import tempfile

import numpy as np

import ndist.collectives as col
import ndist.distributed as dist
from tests.collectives.backends import _capi_ctypes as C


def main() -> None:
    dist.init_process_group("socket")
    r, n = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    h = col.engine_handle()
    with tempfile.TemporaryDirectory() as tmp:
        lib = C.build_library(pathlib.Path(tmp))
        rc, why = C.selftest(str(lib), h)
        assert rc == 0, why
    eng = C.Engine(h)
    for nb in (16, 4096, 300 << 10, 3 << 20):
        a = np.arange(nb // 4, dtype=np.float32) * (r + 1)
        assert eng.all_reduce(a) is None
        assert np.array_equal(a, np.arange(nb // 4, dtype=np.float32) * sum(range(1, n + 1)))
        dist.all_reduce(a)
        b = np.full(nb // 8, r, np.float64)
        assert eng.broadcast(b, n - 1) is None and (b == n - 1).all()
        out = np.empty(nb // 8 * n, np.int64)
        assert eng.all_gather(out, np.full(nb // 8, r, np.int64)) is None
        assert all((out[q * (nb // 8):(q + 1) * (nb // 8)] == q).all() for q in range(n))
        x = np.repeat(np.arange(n, dtype=np.int32) + 10 * r, nb // 4)
        y = np.empty_like(x)
        assert eng.all_to_all(y, x) is None
        assert all((y[q * (nb // 4):(q + 1) * (nb // 4)] == 10 * q + r).all() for q in range(n))
        isz = [(nb // 4) * (q + 1) // n for q in range(n)]  # rank r sends (q + 1) / n of a block to q
        osz = [(nb // 4) * (r + 1) // n] * n
        u = np.concatenate([np.full(s, 10 * r + q, np.int32) for q, s in enumerate(isz)])
        v = np.empty(sum(osz), np.int32)
        assert eng.all_to_all_v(v, osz, u, isz) is None
        assert v.tolist() == [10 * q + r for q in range(n) for _ in range(osz[q])]
        o = np.empty(nb // 4, np.float32)
        assert eng.reduce_scatter(o, np.full(nb // 4 * n, r + 1, np.float32)) is None
        assert (o == sum(range(1, n + 1))).all()
        assert eng.barrier() is None
    dist.destroy_process_group()
    assert eng.barrier()[0] == 6  # NDIST_E_CLOSED


if __name__ == "__main__":
    main()
