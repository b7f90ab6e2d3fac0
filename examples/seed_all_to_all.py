"""The all_to_all examples of PyTorch's documentation page, with ndist.

Run on 4 ranks:   ndistrun --nproc-per-node 4 examples/seed_all_to_all.py
             or   mpiexec -n 4 python examples/seed_all_to_all.py
Each rank prints its lines in rank order (a barrier between ranks).
"""

import ndist
import ndist.distributed as dist


def page_repr(value):
    """``repr``, except that complex numbers are written as Python writes them (``1+1j``), as on the page."""
    if isinstance(value, list):
        return "[" + ", ".join(page_repr(v) for v in value) + "]"
    if isinstance(value, ndist.Tensor) and value.is_complex():
        return "tensor([" + ", ".join(str(z)[1:-1] for z in value.tolist()) + "])"
    return repr(value)


def show(value, rank, world_size):
    """Print ``value  # Rank r`` on every rank, in rank order."""
    for r in range(world_size):
        if r == rank:
            print(f"{page_repr(value)} # Rank {rank}", flush=True)
        dist.barrier()


def main():
    dist.init_process_group()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if world_size != 4:
        raise SystemExit(f"this example needs 4 ranks, got {world_size}")

    # 1. Even split.
    input = ndist.arange(4) + rank * 4
    input = list(input.chunk(4))
    show(input, rank, world_size)
    output = list(ndist.empty([4], dtype=ndist.int64).chunk(4))
    dist.all_to_all(output, input)
    show(output, rank, world_size)

    # 2. Uneven split.
    input = [ndist.arange(0, 6), ndist.arange(10, 19), ndist.arange(20, 25), ndist.arange(30, 37)][rank]
    input_splits = [[2, 2, 1, 1], [3, 2, 2, 2], [2, 1, 1, 1], [2, 2, 2, 1]][rank]
    output_splits = [[2, 3, 2, 2], [2, 2, 1, 2], [1, 2, 1, 2], [1, 2, 1, 1]][rank]
    show(input, rank, world_size)
    show(input_splits, rank, world_size)
    show(output_splits, rank, world_size)
    input = list(input.split(input_splits))
    show(input, rank, world_size)
    output = list(ndist.empty([sum(output_splits)], dtype=ndist.int64).split(output_splits))
    dist.all_to_all(output, input)
    show(output, rank, world_size)

    # 3. Complex tensors (the page builds the output from an int64 tensor: ndist refuses that
    #    with a TypeError, so the output here is cfloat like the input).
    input = ndist.tensor([1 + 1j, 2 + 2j, 3 + 3j, 4 + 4j], dtype=ndist.cfloat) + 4 * rank * (1 + 1j)
    input = list(input.chunk(4))
    show(input, rank, world_size)
    output = list(ndist.empty([4], dtype=ndist.cfloat).chunk(4))
    dist.all_to_all(output, input)
    show(output, rank, world_size)

    # 4. The same exchange as 1, written as one scatter per source rank.
    input = list((ndist.arange(4) + rank * 4).chunk(4))
    scatter_list = input
    gather_list = list(ndist.empty([4], dtype=ndist.int64).chunk(4))
    for i in range(world_size):
        dist.scatter(gather_list[i], scatter_list if i == rank else [], src=i)
    show(gather_list, rank, world_size)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
