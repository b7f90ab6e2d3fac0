"""Run ``<module>.entry()`` on every rank of an MPI job (``init_process_group("mpi")``);
rank 0 writes the list of every rank's result as JSON to argv[2].

    mpiexec -n 4 python -m tests.collectives._mpi_runner tests.collectives.conformance out.json [backend [device]]
"""

import importlib
import json
import sys

import ndist.distributed as dist


def main() -> None:
    module, out = sys.argv[1], sys.argv[2]
    backend = sys.argv[3] if len(sys.argv) > 3 else "mpi"
    device = sys.argv[4] if len(sys.argv) > 4 else "cpu"
    dist.init_process_group(backend)
    result = importlib.import_module(module).entry(dist.get_rank(), dist.get_world_size(), device)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, result)
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(everyone, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
