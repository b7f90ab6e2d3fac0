"""ndist.collectives: public collective functions, argument checking, ReduceOp,
the backend interface (``CollectiveBackend``, ``Call``, ``Op``) and the
backends (socket, mpi, nccl)."""

from . import backends  # noqa: F401  (registers the built-in backends)
from ._api import (
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    all_to_all,
    all_to_all_single,
    barrier,
    broadcast,
    gather,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    scatter,
)
from ._backend import Call, CollectiveBackend, Op  # noqa: F401  (the backend interface)
from ._coalesced import all_gather_coalesced, all_gather_single, all_reduce_coalesced, reduce_scatter_single
from ._debug import flight_recorder
from ._objects import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    recv_object_list,
    scatter_object_list,
    send_object_list,
)
from ._monitored import monitored_barrier
from ._p2p import P2POp, batch_isend_irecv, irecv, isend, recv, send
from ._reduce_op import ReduceOp, _make_nccl_premul_sum
from ._support import supports_complex
from ._engine_query import get_engine
from ._capi import engine_handle, engine_include_dir  # noqa: F401  (the engine's C interface: not torch's)

# The backend interface (CollectiveBackend, Call, Op) is imported from here by
# backend authors; it is not part of ``__all__``, so ``ndist.distributed`` (torch's
# namespace) does not re-export it.
__all__ = [
    "ReduceOp",
    "_make_nccl_premul_sum",
    "all_reduce",
    "reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_gather_coalesced",
    "all_reduce_coalesced",
    "gather",
    "scatter",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
    "send",
    "recv",
    "isend",
    "irecv",
    "P2POp",
    "batch_isend_irecv",
    "broadcast_object_list",
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
    "flight_recorder",
    "get_engine",
    "supports_complex",
]
