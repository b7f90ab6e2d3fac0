"""The per-library part of a benchmark rank: one small adapter per library.

An adapter starts its library's communicator in ``__init__`` and runs each
operation on NumPy buffers the worker owns (wrapping them without copying where
the library has its own tensor type). Every method blocks until the operation
is complete on this rank. In-place ops (all_reduce, broadcast, reduce) work on
``send``; ``recv`` is ``None`` where the rank receives nothing.

Libraries are imported here, inside the adapters, never at module import.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Adapter", "Mpi4pyAdapter", "TorchAdapter", "NdistAdapter", "make_adapter", "library_versions"]


class Adapter:
    """Interface; ``rendezvous(obj)`` is supplied by the worker: rank 0's object is
    returned on every rank (the launcher relays it), for libraries that need to
    publish an address."""

    name = "?"

    size = 1

    # One method per op; each blocks until the op is complete on this rank.
    def all_reduce(self, send, redop):
        raise NotImplementedError

    def reduce(self, send, redop, root):
        raise NotImplementedError

    def broadcast(self, send, root):
        raise NotImplementedError

    def all_gather(self, send, recv):
        raise NotImplementedError

    def reduce_scatter(self, send, recv, redop):
        raise NotImplementedError

    def all_to_all(self, send, recv):
        raise NotImplementedError

    def gather(self, send, recv, root):
        raise NotImplementedError

    def scatter(self, send, recv, root):
        raise NotImplementedError

    def sendrecv(self, send, recv, dst, src):
        raise NotImplementedError

    def barrier(self):
        raise NotImplementedError

    def close(self):
        """Tear the library's communicator down."""

    def wrap(self, arr):
        """The library's view of a NumPy buffer (no copy); called once per buffer per size."""
        return arr

    _last_split = (None, None)

    def split(self, buf):
        """``buf`` as ``size`` equal chunks (cached for the buffer last asked about)."""
        if self._last_split[0] is not buf:
            self._last_split = (buf, np.split(buf, self.size))
        return self._last_split[1]

    def run(self, op: str, send, recv, redop: str, root: int, nranks: int, rank: int) -> None:
        """Dispatch one call of ``op``."""
        if op == "all_reduce":
            self.all_reduce(send, redop)
        elif op == "reduce":
            self.reduce(send, redop, root)
        elif op == "broadcast":
            self.broadcast(send, root)
        elif op == "all_gather":
            self.all_gather(send, recv)
        elif op == "reduce_scatter":
            self.reduce_scatter(send, recv, redop)
        elif op == "all_to_all":
            self.all_to_all(send, recv)
        elif op == "gather":
            self.gather(send, recv, root)
        elif op == "scatter":
            self.scatter(send, recv, root)
        elif op == "sendrecv":
            self.sendrecv(send, recv, (rank + 1) % nranks, (rank - 1) % nranks)
        elif op == "barrier":
            self.barrier()
        else:
            raise ValueError(f"op: unknown operation {op!r}")


# ----------------------------------------------------------------------- mpi4py


class Mpi4pyAdapter(Adapter):
    """Raw mpi4py buffer calls (upper-case API) on ``COMM_WORLD``: the anchor a
    careful mpi4py user would write. ``avg`` is SUM then a divide (MPI has no AVG)."""

    name = "mpi4py"

    def __init__(self, rank, size, rendezvous):
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        if self.comm.Get_size() != size or self.comm.Get_rank() != rank:
            raise RuntimeError(
                f"mpi4py: expected rank {rank} of {size}; MPI says {self.comm.Get_rank()} of {self.comm.Get_size()}"
            )
        self._ops = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}
        self.size = size

    def _post(self, buf, redop):
        if redop == "avg":
            np.divide(buf, self.size, out=buf, casting="unsafe")

    def all_reduce(self, send, redop):
        self.comm.Allreduce(self.MPI.IN_PLACE, send, op=self._ops[redop])
        self._post(send, redop)

    def reduce(self, send, redop, root):
        if self.comm.rank == root:
            self.comm.Reduce(self.MPI.IN_PLACE, send, op=self._ops[redop], root=root)
            self._post(send, redop)
        else:
            self.comm.Reduce(send, None, op=self._ops[redop], root=root)

    def broadcast(self, send, root):
        self.comm.Bcast(send, root=root)

    def all_gather(self, send, recv):
        self.comm.Allgather(send, recv)

    def reduce_scatter(self, send, recv, redop):
        self.comm.Reduce_scatter_block(send, recv, op=self._ops[redop])
        self._post(recv, redop)

    def all_to_all(self, send, recv):
        self.comm.Alltoall(send, recv)

    def gather(self, send, recv, root):
        self.comm.Gather(send, recv, root=root)

    def scatter(self, send, recv, root):
        self.comm.Scatter(send if self.comm.rank == root else None, recv, root=root)

    def sendrecv(self, send, recv, dst, src):
        self.comm.Sendrecv(send, dest=dst, recvbuf=recv, source=src)

    def barrier(self):
        self.comm.Barrier()


# ------------------------------------------------------------------------ torch


class _DistApiAdapter(Adapter):
    """Libraries with torch.distributed's API (torch itself, ndist): ``self.dist`` is the module.
    The ops whose calls are the same in both live here."""

    def all_to_all(self, send, recv):
        self.dist.all_to_all_single(recv, send)

    def gather(self, send, recv, root):
        chunks = self.split(recv) if self.rank == root else None
        self.dist.gather(send, gather_list=chunks, dst=root)

    def scatter(self, send, recv, root):
        chunks = self.split(send) if self.rank == root else None
        self.dist.scatter(recv, scatter_list=chunks, src=root)

    def sendrecv(self, send, recv, dst, src):
        d = self.dist
        ops = [d.P2POp(d.isend, send, dst), d.P2POp(d.irecv, recv, src)]
        for w in d.batch_isend_irecv(ops):
            w.wait()

    def barrier(self):
        self.dist.barrier()

    def close(self):
        self.dist.destroy_process_group()


class TorchAdapter(_DistApiAdapter):
    """torch.distributed with Gloo (``torch``) or ndist's backend "ndist" (``torch:ndist``,
    registered by ``import ndist.torch``); tensors share the NumPy buffers
    (``torch.from_numpy``). Rank 0 hosts a TCPStore on a free port and publishes it."""

    def __init__(self, rank, size, rendezvous, timeout=300.0, backend="gloo"):
        import datetime

        import torch
        import torch.distributed as dist

        if backend == "ndist":
            import ndist.torch  # noqa: F401 - registers the backend
        self.name = "torch" if backend == "gloo" else f"torch:{backend}"

        torch.set_num_threads(1)
        self.torch, self.dist = torch, dist
        td = datetime.timedelta(seconds=timeout)
        if rank == 0:
            store = dist.TCPStore("127.0.0.1", 0, size, True, timeout=td, wait_for_workers=False)
            rendezvous(store.port)
        else:
            port = rendezvous(None)
            store = dist.TCPStore("127.0.0.1", port, size, False, timeout=td)
        dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=td)
        R = dist.ReduceOp
        self._ops = {"sum": R.SUM, "avg": R.SUM, "prod": R.PRODUCT, "max": R.MAX, "min": R.MIN}
        self.size, self.rank = size, rank
        self._ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def wrap(self, arr):
        """A tensor sharing ``arr`` (bfloat16 goes through an int16 view)."""
        if arr is None:
            return None
        if arr.dtype.name == "bfloat16":
            return self.torch.from_numpy(arr.view(np.int16)).view(self.torch.bfloat16)
        return self.torch.from_numpy(arr)

    def split(self, ten):
        if self._last_split[0] is not ten:
            self._last_split = (ten, list(ten.chunk(self.size)))
        return self._last_split[1]

    def _post(self, ten, redop):
        if redop == "avg":
            ten.div_(self.size)

    def all_reduce(self, send, redop):
        self.dist.all_reduce(send, op=self._ops[redop])
        self._post(send, redop)

    def reduce(self, send, redop, root):
        self.dist.reduce(send, dst=root, op=self._ops[redop])
        if self.rank == root:
            self._post(send, redop)

    def broadcast(self, send, root):
        self.dist.broadcast(send, src=root)

    def all_gather(self, send, recv):
        self._ag(recv, send)

    def reduce_scatter(self, send, recv, redop):
        self._rs(recv, send, op=self._ops[redop])
        self._post(recv, redop)


# ------------------------------------------------------------------------ ndist


class NdistAdapter(_DistApiAdapter):
    """ndist.distributed on NumPy arrays, with the ``socket`` or ``mpi`` backend."""

    def __init__(self, rank, size, rendezvous, backend="socket", timeout=300.0):
        import datetime

        import ndist.distributed as dist

        self.dist = dist
        self.name = f"ndist[{backend}]"
        td = datetime.timedelta(seconds=timeout)
        if backend == "mpi":
            dist.init_process_group("mpi", timeout=td)
        else:
            if rank == 0:
                store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, timeout=td, wait_for_workers=False)
                rendezvous(store.port)
            else:
                port = rendezvous(None)
                store = dist.TCPStore("127.0.0.1", port, size, is_master=False, timeout=td)
            dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=td)
        if dist.get_rank() != rank or dist.get_world_size() != size:
            raise RuntimeError(
                f"{self.name}: expected rank {rank} of {size}; got {dist.get_rank()} of {dist.get_world_size()}"
            )
        R = dist.ReduceOp
        self._ops = {"sum": R.SUM, "avg": R.AVG, "prod": R.PRODUCT, "max": R.MAX, "min": R.MIN}
        self.size, self.rank = size, rank

    def all_reduce(self, send, redop):
        self.dist.all_reduce(send, op=self._ops[redop])

    def reduce(self, send, redop, root):
        self.dist.reduce(send, dst=root, op=self._ops[redop])

    def broadcast(self, send, root):
        self.dist.broadcast(send, src=root)

    def all_gather(self, send, recv):
        self.dist.all_gather_into_tensor(recv, send)

    def reduce_scatter(self, send, recv, redop):
        self.dist.reduce_scatter_tensor(recv, send, op=self._ops[redop])


def make_adapter(lib: str, rank: int, size: int, rendezvous, timeout: float) -> Adapter:
    """The adapter for ``lib`` (``mpi4py``, ``torch``, ``torch:ndist``, ``ndist[socket]``, ``ndist[mpi]``)."""
    if lib == "mpi4py":
        return Mpi4pyAdapter(rank, size, rendezvous)
    if lib == "torch":
        return TorchAdapter(rank, size, rendezvous, timeout=timeout)
    if lib == "torch:ndist":
        return TorchAdapter(rank, size, rendezvous, timeout=timeout, backend="ndist")
    if lib.startswith("ndist[") and lib.endswith("]"):
        return NdistAdapter(rank, size, rendezvous, backend=lib[6:-1], timeout=timeout)
    raise ValueError(f"library: expected mpi4py, torch, torch:ndist or ndist[<backend>]; got {lib!r}")


def library_versions(lib: str) -> dict:
    """Versions that describe ``lib`` in the header (called inside a rank, after its adapter
    initialized the group), and for ndist the engine under the group's CPU collectives."""
    import numpy

    out = {"numpy": numpy.__version__}
    if lib == "mpi4py" or lib == "ndist[mpi]":
        import mpi4py
        from mpi4py import MPI

        out["mpi4py"] = mpi4py.__version__
        out["mpi"] = " ".join(MPI.Get_library_version().split("\n")[0].replace("Version:", "").split())
    if lib.startswith("torch"):
        import torch

        out["torch"] = torch.__version__
    if lib.startswith("ndist") or lib == "torch:ndist":
        import ndist

        out["ndist"] = ndist.__version__
    if lib.startswith("ndist"):
        import ndist.distributed as dist

        try:
            out["engine"] = dist.get_engine()
        except Exception as err:  # noqa: BLE001 - the header must not stop the run
            out["engine"] = f"unknown ({err})"
    return out
