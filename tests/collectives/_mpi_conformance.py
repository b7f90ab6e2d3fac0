"""Run the conformance checks under mpiexec; rank 0 writes ``{combo: failure}`` as JSON to argv[1]."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import conformance  # noqa: E402

import ndist.distributed as dist  # noqa: E402


def main() -> None:
    dist.init_process_group("mpi")
    results = conformance.run_all(dist)
    from mpi4py import MPI

    everyone = MPI.COMM_WORLD.gather(results, root=0)
    if MPI.COMM_WORLD.Get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(everyone, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
