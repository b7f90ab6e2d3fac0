"""ndist.torch: ndist's backends as a torch.distributed backend.

``import ndist.torch`` registers backend ``"ndist"`` for CPU tensors, so a
torch program (DDP included) runs its collectives on ndist with
``torch.distributed.init_process_group("ndist")``; ``init_method="ndist://"``
rendezvous through ndist's launcher detection (ndistrun, mpiexec, srun). See
docs/torch.md.

This is the only part of ndist that imports torch; ``import ndist`` never does.
Importing it with a torch outside the supported releases (``_version.SUPPORTED``)
raises ImportError naming both.
"""

import torch as _torch

from . import _version

_version.check(_torch.__version__)

from ._backend import BACKEND_ENV, Options, create, register
from ._group import BACKEND_NAME, ProcessGroupNdist
from ._grow import grow_group, joined_running_job
from ._rendezvous import StoreForTorch
from ._shrink import get_failed_ranks
from ._standalone import make_process_group
from ._store import TorchStore
from ._work import NdistWork, as_torch_error

register()

__all__ = ["BACKEND_ENV", "BACKEND_NAME", "Options", "ProcessGroupNdist", "TorchStore", "StoreForTorch", "NdistWork",
           "as_torch_error", "create", "get_failed_ranks", "grow_group", "joined_running_job", "make_process_group",
           "register"]
