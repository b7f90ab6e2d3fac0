"""The per-library part of a benchmark rank: one small adapter per library.

An adapter starts its library's communicator in ``__init__`` and runs each
operation on NumPy buffers the worker owns (wrapping them without copying where
the library has its own tensor type). Every method blocks until the operation
is complete on this rank. In-place ops (all_reduce, broadcast, reduce) work on
``send``; ``recv`` is ``None`` where the rank receives nothing.

Libraries are imported here, inside the adapters, never at module import.

Besides the ops, an adapter class says what the launcher and the runner need to know
before any rank starts (class methods, no library imported): ``not_offered`` (an op
the library has no call for: printed as absent, never run through something else),
``environment`` (variables its ranks need) and ``leftovers`` (files a killed rank
may leave, removed by the launcher).
"""

from __future__ import annotations

import importlib
import logging
import os

import numpy as np

__all__ = ["STORE_HOST_ENV", "store_host", "Adapter", "Mpi4pyAdapter", "TorchAdapter", "NdistAdapter",
           "DeepSpeedAdapter", "adapter_class", "make_adapter", "library_versions", "not_offered"]

log = logging.getLogger("ndist.bench")

# Where rank 0 hosts the store of torch's and ndist's groups and the others reach it: 127.0.0.1
# unless this variable names rank 0's address (ranks on several hosts: benchmarks/multihost.py).
STORE_HOST_ENV = "NDIST_BENCH_STORE_HOST"


def store_host() -> str:
    """The address of rank 0's store (``NDIST_BENCH_STORE_HOST``, default 127.0.0.1)."""
    return os.environ.get(STORE_HOST_ENV) or "127.0.0.1"


class Adapter:
    """Interface; ``rendezvous(obj)`` is supplied by the worker: rank 0's object is
    returned on every rank (the launcher relays it), for libraries that need to
    publish an address."""

    name = "?"

    size = 1

    @classmethod
    def not_offered(cls, op: str, dtype: str, redop: str) -> str | None:
        """Why this library has no call for ``op`` on ``dtype`` with ``redop`` (None: it has)."""
        return None

    @classmethod
    def environment(cls, nproc: int, tag: str) -> dict:
        """Variables every rank's environment needs (``tag``: unique to one group of ranks)."""
        return {}

    @classmethod
    def leftovers(cls, nproc: int, tag: str) -> list:
        """Paths the ranks of the group ``tag`` may leave behind when they are killed."""
        return []

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


def _start_torch_group(dist, rank, size, rendezvous, timeout, backend):
    """``dist.init_process_group(backend)`` on a TCPStore that rank 0 hosts on a free port
    (at ``store_host()``) and publishes through ``rendezvous``."""
    import datetime

    td = datetime.timedelta(seconds=timeout)
    host = store_host()
    if rank == 0:
        store = dist.TCPStore(host, 0, size, True, timeout=td, wait_for_workers=False)
        rendezvous(store.port)
    else:
        port = rendezvous(None)
        store = dist.TCPStore(host, port, size, False, timeout=td)
    dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=td)


def _torch_view(torch, arr):
    """A tensor sharing ``arr`` (bfloat16 goes through an int16 view)."""
    if arr is None:
        return None
    if arr.dtype.name == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


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
        import torch
        import torch.distributed as dist

        if backend == "ndist":
            import ndist.torch  # noqa: F401 - registers the backend
        self.name = "torch" if backend == "gloo" else f"torch:{backend}"

        torch.set_num_threads(1)
        self.torch, self.dist = torch, dist
        _start_torch_group(dist, rank, size, rendezvous, timeout, backend)
        R = dist.ReduceOp
        self._ops = {"sum": R.SUM, "avg": R.SUM, "prod": R.PRODUCT, "max": R.MAX, "min": R.MIN}
        self.size, self.rank = size, rank
        self._ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def wrap(self, arr):
        """A tensor sharing ``arr`` (bfloat16 goes through an int16 view)."""
        return _torch_view(self.torch, arr)

    def split(self, ten):
        if self._last_split[0] is not ten:
            self._last_split = (ten, list(ten.chunk(self.size)))
        return self._last_split[1]

    def _post(self, ten, redop):
        if redop == "avg":  # integers truncate, as ndist's AVG does
            ten.div_(self.size, rounding_mode=None if ten.is_floating_point() else "trunc")

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


class TorchNdistAdapter(TorchAdapter):
    """torch.distributed on backend "ndist", its compiled backend (``torch:ndist``: the C++
    ``c10d::Backend`` over ndist's engine; the run fails where it cannot be built) or its Python
    one (``torch:ndist-python``, the reference), picked through ``$NDIST_TORCH_COMPILED`` in the
    ranks' environment."""

    _COMPILED = "1"

    @classmethod
    def environment(cls, nproc, tag):
        return {"NDIST_TORCH_COMPILED": cls._COMPILED}

    def __init__(self, rank, size, rendezvous, timeout=300.0):
        super().__init__(rank, size, rendezvous, timeout=timeout, backend="ndist")
        self.name = _NDIST_TORCH_NAMES[type(self)]


class TorchNdistPythonAdapter(TorchNdistAdapter):
    """``torch:ndist-python``: backend "ndist" on its Python backend (``ProcessGroupNdist``)."""

    _COMPILED = "0"


class TorchNdistOpAdapter(TorchNdistAdapter):
    """``torch:ndist-op``: ndist's torch custom ops (``torch.ops.ndist.all_reduce_``,
    ``broadcast_``, ``all_gather_into``: docs/torch.md, "Custom ops"), the drop-in for
    DeepSpeed's ``torch.ops.deepspeed.inference_all_reduce_``, on a backend-"ndist" group on
    the compiled backend; the ops go to ndist's engine without torch.distributed's layer."""

    _REDOPS = {"sum": "sum", "prod": "product", "max": "max", "min": "min", "avg": "avg"}

    @classmethod
    def not_offered(cls, op, dtype, redop):
        if op not in ("all_reduce", "broadcast", "all_gather"):
            return f"ndist's custom ops are all_reduce_, broadcast_ and all_gather_into (no {op})"
        return None

    def __init__(self, rank, size, rendezvous, timeout=300.0):
        super().__init__(rank, size, rendezvous, timeout=timeout)
        import ndist.torch.ops as ops

        if not ops.load():
            raise RuntimeError("torch:ndist-op: ndist's compiled torch module could not be built (see the warning)")
        self._name = self.dist.group.WORLD.group_name
        self._ops_ns = self.torch.ops.ndist

    def all_reduce(self, send, redop):
        self._ops_ns.all_reduce_(send, self._name, self._REDOPS[redop])

    def broadcast(self, send, root):
        self._ops_ns.broadcast_(send, root, self._name)

    def all_gather(self, send, recv):
        self._ops_ns.all_gather_into(recv, send, self._name)


_NDIST_TORCH_NAMES = {TorchNdistAdapter: "torch:ndist", TorchNdistPythonAdapter: "torch:ndist-python",
                      TorchNdistOpAdapter: "torch:ndist-op"}


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
            host = store_host()
            if rank == 0:
                store = dist.TCPStore(host, 0, size, is_master=True, timeout=td, wait_for_workers=False)
                rendezvous(store.port)
            else:
                port = rendezvous(None)
                store = dist.TCPStore(host, port, size, is_master=False, timeout=td)
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


# -------------------------------------------------------------------- deepspeed


class DeepSpeedAdapter(Adapter):
    """DeepSpeed's shared-memory all_reduce, the one its CPU tensor-parallel inference runs:
    ``deepspeed.comm.inference_all_reduce`` (what ``module_inject``'s ``LinearAllreduce`` calls).
    On the CPU accelerator it runs ``torch.ops.deepspeed.inference_all_reduce_``, an op of the
    ``deepspeed_shm_comm`` extension (``ShareMemCommBuilder``: ``csrc/cpu/comm/shm*.cpp``,
    compiled by torch.utils.cpp_extension the first time a rank loads it, then cached).
    The process group underneath is torch.distributed on Gloo, started as ``TorchAdapter``
    starts it; it runs the worker's barriers and never a measured op.

    ``not_offered``: the shared-memory path is all_reduce, SUM, float32 / float16 / bfloat16
    and nothing else. deepspeed.comm hands every other op to torch.distributed (Gloo, which
    ``torch`` measures already); ``inference_all_reduce`` sums whatever ``op`` it is given,
    and its kernel returns other dtypes unreduced. Where the CPU lacks the kernels' ISA
    (AVX2 for float32, AVX-512BW for the 16-bit types) DeepSpeed would fall back to Gloo:
    that is an error here, not a quiet fallback.

    DeepSpeed's op reads its setup from the environment (``environment``): ``LOCAL_SIZE``
    equal to the world size turns it on, and ``MASTER_ADDR`` / ``MASTER_PORT`` only name its
    segments (``/dev/shm/deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank>``, one per rank,
    2 + 64 MiB each), which it never unlinks. Once every rank has mapped every segment,
    each rank unlinks its own; the launcher removes what a killed rank left (``leftovers``)."""

    name = "deepspeed"

    # dtype -> the level of ``vector_kernel_level()`` its kernel needs (1: AVX2, 2: AVX-512BW),
    # as deepspeed/comm/torch.py decides between the kernel and Gloo
    _LEVEL = {"float32": 1, "float16": 2, "bfloat16": 2}
    _SEGMENT = "deepspeed_allreduce_buffer"  # shm.cpp's SHM_BUFFER_NAME
    _ADDR = "127.0.0.1"

    @classmethod
    def not_offered(cls, op, dtype, redop):
        if op != "all_reduce":
            return (f"DeepSpeed's shared-memory path has no {op}: deepspeed.comm runs it on "
                    "torch.distributed (Gloo, see --compare torch)")
        if redop != "sum":
            return f"inference_all_reduce always sums (it ignores op={redop})"
        if dtype not in cls._LEVEL:
            return f"the shm kernels reduce {', '.join(cls._LEVEL)} only ({dtype} is returned unreduced)"
        return None

    @classmethod
    def environment(cls, nproc, tag):
        return {"DS_ACCELERATOR": "cpu", "LOCAL_SIZE": str(nproc), "MASTER_ADDR": cls._ADDR, "MASTER_PORT": tag}

    @classmethod
    def segment(cls, rank, tag, addr=_ADDR):
        """The path of rank ``rank``'s segment in the group ``tag`` (shm.cpp's ``shm_initialize``)."""
        return f"/dev/shm/{cls._SEGMENT}_{os.getuid()}_{addr}_{tag}_{rank}"

    @classmethod
    def leftovers(cls, nproc, tag):
        return [cls.segment(r, tag) for r in range(nproc)]

    def __init__(self, rank, size, rendezvous, timeout=300.0):
        import datetime

        import torch
        import torch.distributed as dist

        env = os.environ
        if env.get("LOCAL_SIZE") != str(size) or not env.get("MASTER_PORT"):
            raise RuntimeError(
                f"deepspeed: its shared-memory op needs LOCAL_SIZE={size} and MASTER_PORT (set by the launcher, "
                f"DeepSpeedAdapter.environment); got LOCAL_SIZE={env.get('LOCAL_SIZE')!r}, "
                f"MASTER_PORT={env.get('MASTER_PORT')!r}"
            )
        torch.set_num_threads(1)
        self.torch, self.dist, self.size, self.rank = torch, dist, size, rank
        _start_torch_group(dist, rank, size, rendezvous, timeout, "gloo")

        import deepspeed.comm as ds_comm

        # torch.distributed is up: DeepSpeed wraps it in its TorchBackend, which builds (or loads)
        # the shm op and maps every rank's segment before it returns
        ds_comm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False,
                                 timeout=datetime.timedelta(seconds=timeout))
        backend = importlib.import_module("deepspeed.comm.comm").cdb  # the backend init_distributed made
        if getattr(backend, "shm_comm_op", None) is None or not hasattr(torch.ops.deepspeed,
                                                                         "inference_all_reduce_"):
            raise RuntimeError(f"deepspeed: no shared-memory op on {type(backend).__name__}: "
                               "inference_all_reduce would be torch.distributed's (Gloo)")
        self.level = int(backend.shm_vector_kernel_level)
        self._iar = ds_comm.inference_all_reduce
        dist.barrier()  # every rank has mapped every segment: the names can go
        own = self.segment(rank, env["MASTER_PORT"], env.get("MASTER_ADDR", ""))
        try:
            os.unlink(own)
        except FileNotFoundError:
            log.warning("deepspeed: its segment %s was not found to unlink (renamed in this DeepSpeed?)", own)

    def wrap(self, arr):
        """A tensor sharing ``arr``; an error where DeepSpeed would send its dtype to Gloo."""
        if arr is not None and arr.size:
            need = self._LEVEL.get(arr.dtype.name)
            if need is None or self.level < need:
                raise RuntimeError(
                    f"deepspeed: inference_all_reduce on {arr.dtype.name} needs kernel level {need} "
                    f"(1: AVX2, 2: AVX-512BW); this CPU has {self.level}: DeepSpeed would run Gloo's all_reduce"
                )
        return _torch_view(self.torch, arr)

    def all_reduce(self, send, redop):
        self._iar(send)

    def barrier(self):
        self.dist.barrier()

    def close(self):
        self.dist.destroy_process_group()


_CLASSES = {"mpi4py": Mpi4pyAdapter, "torch": TorchAdapter, "torch:ndist": TorchNdistAdapter,
            "torch:ndist-python": TorchNdistPythonAdapter, "torch:ndist-op": TorchNdistOpAdapter,
            "deepspeed": DeepSpeedAdapter}


def adapter_class(lib: str) -> type[Adapter] | None:
    """The adapter class that runs ``lib`` (None: no adapter takes that name)."""
    if lib.startswith("ndist[") and lib.endswith("]"):
        return NdistAdapter
    return _CLASSES.get(lib)


def not_offered(lib: str, op: str, dtype: str, redop: str) -> str | None:
    """Why ``lib`` has no call for ``op`` (None: it has one, or ``lib`` is unknown)."""
    cls = adapter_class(lib)
    return None if cls is None else cls.not_offered(op, dtype, redop)


def make_adapter(lib: str, rank: int, size: int, rendezvous, timeout: float) -> Adapter:
    """The adapter for ``lib`` (``mpi4py``, ``torch``, ``torch:ndist``, ``deepspeed``, ``ndist[socket]``,
    ``ndist[mpi]``)."""
    if lib == "mpi4py":
        return Mpi4pyAdapter(rank, size, rendezvous)
    if lib == "torch":
        return TorchAdapter(rank, size, rendezvous, timeout=timeout)
    if lib in ("torch:ndist", "torch:ndist-python", "torch:ndist-op"):
        return _CLASSES[lib](rank, size, rendezvous, timeout=timeout)
    if lib == "deepspeed":
        return DeepSpeedAdapter(rank, size, rendezvous, timeout=timeout)
    if lib.startswith("ndist[") and lib.endswith("]"):
        return NdistAdapter(rank, size, rendezvous, backend=lib[6:-1], timeout=timeout)
    raise ValueError(f"library: expected mpi4py, torch, torch:ndist, torch:ndist-python, torch:ndist-op, deepspeed "
                     f"or ndist[<backend>]; got {lib!r}")


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
    if lib.startswith("torch") or lib == "deepspeed":
        import torch

        out["torch"] = str(torch.__version__)  # a plain str: unpickling a TorchVersion imports torch
    if lib == "deepspeed":
        import deepspeed

        out["deepspeed"] = deepspeed.__version__
        out["op"] = "inference_all_reduce (shm)"
    if lib.startswith("ndist") or lib.startswith("torch:ndist"):
        import ndist

        out["ndist"] = ndist.__version__
    if lib.startswith("torch:ndist"):
        import ndist.torch.ops as ops

        out["torch backend"] = "compiled" if ops.engine_calls() >= 0 else "python"
    if lib.startswith("ndist"):
        import ndist.distributed as dist

        try:
            out["engine"] = dist.get_engine()
        except Exception as err:  # noqa: BLE001 - the header must not stop the run
            out["engine"] = f"unknown ({err})"
    return out
