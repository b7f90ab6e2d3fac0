"""ndist.testing: helpers for testing distributed code (run a function on N ranks; several
"hosts" on one machine as network namespaces, with ``ndistrun`` launched in each)."""

from ._testing._netns import (Hosts, free_port_in, launch_nodes, make_hosts, namespaces, ndist_env, node_commands,
                              outputs, skip_unless_mpich_hosts, wait_launchers)
from ._testing._run import RankFailedError, kill_tree, run_ranks

__all__ = ["run_ranks", "RankFailedError", "kill_tree", "Hosts", "make_hosts", "namespaces",
           "skip_unless_mpich_hosts",
           "free_port_in", "node_commands", "launch_nodes", "wait_launchers", "ndist_env", "outputs"]
