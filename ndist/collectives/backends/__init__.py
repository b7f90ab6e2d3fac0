"""Built-in backends, registered by name without importing them."""

from ...runtime import register_backend

register_backend("socket", "ndist.collectives.backends.socket:create", devices=("cpu", "cuda"))
register_backend("gloo", "ndist.collectives.backends.socket:create", devices=("cpu", "cuda"))
register_backend("mpi", "ndist.collectives.backends.mpi:create", devices=("cpu", "cuda"),
                 is_available="ndist.collectives.backends.mpi:is_available", needs_store=False)
register_backend("nccl", "ndist.collectives.backends.nccl:create", devices=("cuda",),
                 is_available="ndist.collectives.backends.nccl:is_available")
