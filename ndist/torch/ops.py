"""``torch.ops.ndist``: collectives as torch custom ops, for inference code that runs
tensor parallelism on the CPU (docs/torch.md, "Custom ops").

* ``torch.ops.ndist.all_reduce_(t, group_name, op="sum") -> t`` (``op``: ``"sum"``,
  ``"avg"``, ``"product"``, ``"min"``, ``"max"``, ``"band"``, ``"bor"``, ``"bxor"``);
* ``torch.ops.ndist.broadcast_(t, src, group_name) -> t`` (``src``: a group rank);
* ``torch.ops.ndist.all_gather_into(out, t, group_name) -> out`` (``out``: the group
  size times ``t``'s elements, rank r's at block r).

``group_name`` is the name torch gives the group (``group.group_name``,
``dist.group.WORLD.group_name``), as torch's functional collectives take it. On a
backend-``"ndist"`` group served by the compiled backend, a dense contiguous CPU tensor
goes straight to the native engine through its C interface (the group's timeout, failure
detection and shared memory are the group's); any other group or tensor runs the
group's own collective. They have Meta kernels, so ``torch.compile(fullgraph=True)``
traces them. They come with the compiled module: ``load()`` builds or loads it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as tdist

from . import _compiled

__all__ = ["load", "engine_calls"]


def load() -> bool:
    """Build (once; cached) or load the compiled module, which registers ``torch.ops.ndist``;
    whether the ops are there (False where it cannot be built, after one warning)."""
    return _compiled.load() is not None


def engine_calls(group: Any = None) -> int:
    """How many ops ``group``'s CPU backend ran through the native engine directly (the
    compiled path), or -1 when that backend is not ndist's compiled one (the Python
    backend, another backend). ``group``: a torch process group (None: the default)."""
    module = _compiled.loaded()  # (a group on the compiled backend loaded it)
    if module is None:
        return -1
    pg = group if group is not None else tdist.distributed_c10d._get_default_group()
    try:
        backend = pg._get_backend(torch.device("cpu"))
    except (RuntimeError, AttributeError):
        return -1
    try:
        return module.engine_calls(backend)
    except TypeError:  # the Python backend: a ProcessGroup, not a c10d Backend
        return -1
