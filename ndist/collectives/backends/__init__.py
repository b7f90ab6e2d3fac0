"""The built-in backends: a table of names, factories and probes, registered
without importing any backend (each ``"module:attr"`` is resolved on first use)."""

from ...runtime import register_backend

#: name -> (factory, devices, availability probe, needs a store)
BUILTIN = {
    "socket": ("ndist.collectives.backends.socket:create", ("cpu", "cuda"), None, True),
    "gloo": ("ndist.collectives.backends.socket:create", ("cpu", "cuda"), None, True),
    "mpi": ("ndist.collectives.backends.mpi:create", ("cpu", "cuda"),
            "ndist.collectives.backends.mpi:is_available", False),
    "nccl": ("ndist.collectives.backends.nccl:create", ("cuda",),
             "ndist.collectives.backends.nccl:is_available", True),
}

#: name -> why shrink_group cannot shrink its groups (found at run time)
SHRINK_REFUSALS = {
    "mpi": "ndist.collectives.backends.mpi:shrink_refusal",
}

for _name, (_factory, _devices, _probe, _needs_store) in BUILTIN.items():
    register_backend(_name, _factory, devices=_devices, is_available=_probe, needs_store=_needs_store,
                     shrink_refusal=SHRINK_REFUSALS.get(_name))
