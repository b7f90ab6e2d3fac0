"""CUDA tensors and CPU tensors in one program: NCCL for the first, the socket backend for the second.

``init_process_group()`` with no backend gives ``cpu:socket,cuda:nccl`` on a machine with
GPUs, so each collective goes to the backend of its tensors' device. One rank per GPU:

    ndistrun --nproc-per-node $(nvidia-smi -L | wc -l) examples/gpu_all_reduce.py

Without CuPy or a GPU the program says so and exits 0.
"""

import os
import sys

import ndist
import ndist.distributed as dist


def main():
    if not ndist.cuda.is_available():
        print("skipped: no CUDA GPU available to ndist (CuPy missing or no device)")
        return
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    ndist.cuda.set_device(local_rank % ndist.cuda.device_count())
    dist.init_process_group()
    rank, world_size = dist.get_rank(), dist.get_world_size()

    grads = ndist.full((1 << 20,), float(rank + 1), device="cuda")      # on this rank's GPU
    work = dist.all_reduce(grads, async_op=True)                          # NCCL, on the current stream
    steps = ndist.tensor([rank], dtype=ndist.int64)                        # on the CPU: socket backend
    dist.all_reduce(steps, op=dist.ReduceOp.MAX)
    work.wait()                                                           # current stream waits for NCCL
    expected = world_size * (world_size + 1) / 2
    ok = bool((grads == expected).all().item()) and steps.item() == world_size - 1
    if rank == 0:
        print(f"backend {dist.get_backend()!r}, {world_size} rank(s), device {grads.device}: "
              f"all_reduce -> {grads[0].item():g} (expected {expected:g})")
        print("OK" if ok else "FAILED")
    dist.destroy_process_group()
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
