"""``make_process_group``: a backend-"ndist" torch process group from a store, a rank and a size.

torch builds its groups through ``init_process_group`` / ``new_group``, which hand the
backend's creator (``_backend.create``) torch's private ``_DistributedBackendOptions``.
Libraries that manage their own groups outside torch's world, as torchft does on every
reconfiguration, build one directly from ``(store, rank, world_size, timeout)``, the way
``torch.distributed.ProcessGroupGloo(store, rank, size, timeout)`` is built. This is that
constructor for backend "ndist", with public arguments only.

The group is not torch's default group and is not registered in torch's world (no
``torch.distributed.get_rank(group)`` on it; its own ``rank()`` / ``size()`` work): it is
the object a library calls ops on. It does not join the job's member watch either (that
belongs to the default group and numbers the job's processes, which a group of replicas
does not share): a member that dies is named by the group's own connections, a typed
``DistNetworkError`` on the pending and next ops, and ``abort()`` / ``shutdown()`` end it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as tdist

from . import _secret
from ._backend import Options
from ._group import ProcessGroupNdist
from ._store import TorchStore

__all__ = ["make_process_group"]


def _int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__} ({value!r})")
    return value


def make_process_group(store: Any, rank: int, world_size: int, timeout: timedelta = timedelta(minutes=10), *,
                       options: Options | None = None, group_name: str = "standalone") -> ProcessGroupNdist:
    """A backend-"ndist" ``torch.distributed.ProcessGroup`` of ``world_size`` processes.

    ``store``: a ``torch.distributed.Store`` every member reaches (a ``TCPStore``, a
    ``FileStore``, a ``PrefixStore`` over one), used for this group's rendezvous and its
    job secret. ``rank`` in ``[0, world_size)``; ``timeout`` bounds the rendezvous and every
    op. ``options``: as ``pg_options`` of backend "ndist" (``ndist.torch.Options``).
    ``group_name`` must be the same on every member; two groups on one store need two
    names (or a ``PrefixStore`` each, as torchft makes per quorum). Every member calls it;
    it returns once the group is connected. Bad arguments raise before the store is used.
    """
    if not isinstance(store, tdist.Store):
        raise TypeError(f"store: expected a torch.distributed.Store, got {type(store).__name__}")
    world_size = _int("world_size", world_size)
    if world_size < 1:
        raise ValueError(f"world_size: expected an int >= 1, got {world_size}")
    rank = _int("rank", rank)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: expected an int in [0, {world_size}), got {rank}")
    if not isinstance(timeout, timedelta):
        raise TypeError(f"timeout: expected a datetime.timedelta, got {type(timeout).__name__} ({timeout!r})")
    if timeout <= timedelta(0):
        raise ValueError(f"timeout: expected a positive timedelta, got {timeout}")
    if options is None:
        options = Options()
    elif not isinstance(options, Options):
        raise TypeError(f"options: expected ndist.torch.Options or None, got {type(options).__name__}")
    if not isinstance(group_name, str) or not group_name:
        raise ValueError(f"group_name: expected a non-empty str, got {group_name!r}")
    backend = options.resolved_backend()
    nd_store = TorchStore(store, timeout)
    _secret.agree(nd_store)
    return ProcessGroupNdist(nd_store, rank, world_size, timeout, group_name, list(range(world_size)), backend,
                             options)
