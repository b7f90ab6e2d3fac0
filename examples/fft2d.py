"""A distributed 2-D FFT: complex all_to_all as the transpose, as MPI codes do it.

The N x N matrix is split into row slabs, one per rank. A 2-D FFT is a 1-D FFT along rows,
a global transpose, and a 1-D FFT along rows again. The transpose is one all_to_all: rank r
cuts its slab into world_size column blocks, block j goes to rank j, and each received
block is transposed locally. Rank 0 gathers the result and checks it against numpy.fft.fft2.

The same file runs under MPI (the ``mpi`` backend is picked automatically) and ndistrun:

    mpiexec -n 4 python examples/fft2d.py
    ndistrun --nproc-per-node 4 examples/fft2d.py
"""

import numpy as np

import ndist
import ndist.distributed as dist

N = 64


def transpose(slab, world_size):
    """Global transpose of a row-slab-distributed square matrix (complex all_to_all)."""
    rows = slab.shape[0]
    send = [ndist.from_numpy(np.ascontiguousarray(block)) for block in np.split(slab, world_size, axis=1)]
    recv = [ndist.empty((rows, rows), dtype=ndist.complex128) for _ in range(world_size)]
    dist.all_to_all(recv, send)
    # block j came from rank j's rows; transposed, it is columns j*rows.. of our new rows
    return np.concatenate([b.numpy().T for b in recv], axis=1)


def main():
    dist.init_process_group()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if N % world_size:
        raise SystemExit(f"N={N} must be divisible by the number of ranks ({world_size})")
    rows = N // world_size

    full = np.random.default_rng(0).standard_normal((N, N)) + 1j * np.random.default_rng(1).standard_normal((N, N))
    slab = full[rank * rows:(rank + 1) * rows]       # this rank's rows

    step1 = np.fft.fft(slab, axis=1)                 # FFT along rows
    step2 = transpose(step1, world_size)             # now holds columns as rows
    step3 = np.fft.fft(step2, axis=1)                # FFT along the former columns
    result = transpose(step3, world_size)            # back to row slabs

    gathered = [ndist.empty((rows, N), dtype=ndist.complex128) for _ in range(world_size)] if rank == 0 else None
    dist.gather(ndist.from_numpy(np.ascontiguousarray(result)), gathered, dst=0)
    if rank == 0:
        fft = np.concatenate([g.numpy() for g in gathered])
        err = float(np.abs(fft - np.fft.fft2(full)).max())
        print(f"2-D FFT of a {N}x{N} complex matrix on {world_size} ranks ({dist.get_backend()} backend): "
              f"max |error| vs numpy.fft.fft2 = {err:.1e}")
        print("OK" if err < 1e-9 else "FAILED")
        if err >= 1e-9:
            raise SystemExit(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
