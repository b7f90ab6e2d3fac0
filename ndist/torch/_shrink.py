"""``torch.distributed.shrink_group`` on backend ``"ndist"``.

torch's ``shrink_group(ranks_to_exclude, group, shrink_flags, pg_options)`` (2.13 and 2.14)
checks its arguments, asks the group for its cpu backend (``_get_backend``), checks
``supports_shrinking``, calls ``shrink(sorted(excluded), flags, pg_options)`` on it and
then builds the new torch group around what that returns; it destroys the old group
(and, for the default group, every other group) and registers the new one.

Here the torch group is the backend (``ProcessGroupNdist`` is a Python
``ProcessGroup``, as torch keeps a Python backend), so:

* ``backend_for`` answers the group's ``_get_backend``: the group itself for cpu;
* ``shrink`` runs ndist's own shrink on the ndist group underneath
  (``ndist.runtime._shrink``: the same checks, and the agreement through the
  group's store, so survivors that saw different losses agree on their union) and
  returns a new ``ProcessGroupNdist`` of the survivors, renumbered in order, over a
  store namespace of its own; a member it keeps that was already lost (it died
  during the agreement) makes it revoked at birth, and it is shrunk the same way;
* ``install`` teaches torch's last step to keep a Python group as the new group
  itself: torch 2.13 and 2.14 clone the old group's store and register what ``shrink``
  returned as the backend of a new C++ ``ProcessGroup``, which takes only a C++
  ``Backend`` (``ProcessGroupNdist`` is a ``ProcessGroup``: ``_group``'s module doc).
  ``_finalize_shrunk_group`` is wrapped: a ``ProcessGroup`` returned by ``shrink`` is
  named, registered and used as the new group, as ``init_process_group`` uses a Python
  group; anything else goes to torch's own function, with the excluded ranks as global
  ranks (torch's step mistakes group ranks for global ones);
* on the compiled backend (``_compiled``: torch's group is torch's own, with a C++
  ``Backend``) torch finds ``supports_shrinking`` and ``shrink`` on the backend's own
  Python class (torch 2.13's ``Backend`` binds neither); its ``shrink`` is
  ``shrink_compiled``: ``shrink`` above, then a compiled backend over the new group, which
  torch's own last step registers (it clones the store: ``ndist://``'s ``StoreForTorch``
  offers ``clone``).

Errors cross to torch as its own (``as_torch_error``): a lost member is
``torch.distributed.DistNetworkError`` whose ``__cause__`` is ndist's
``DistRankFailureError``, with ``failed_ranks`` copied onto it.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
import torch.distributed as tdist
from torch.distributed import distributed_c10d as c10d

from ..runtime import DistError
from ..runtime import ProcessGroup as NdistGroup
from ..runtime._shrink import agree_exclusion, check_request, note_excluded
from ..runtime.store import PrefixStore
from . import _compiled, _watch
from ._work import as_torch_error

__all__ = ["backend_for", "get_failed_ranks", "shrink", "shrink_compiled", "supports_shrinking", "install"]

log = logging.getLogger("ndist.torch.shrink")

#: ndist backends whose groups can be rebuilt from the group's store alone
_SHRINKABLE_BACKENDS = ("socket",)
#: ``get_failed_ranks``: how long a member the group recorded lost, not (yet) told of by the
#: watch, is given for the watch's verdict: while its watch connection stays open (alive:
#: an op's error uses the same grace, ``collectives/_common.py``), and in all once that
#: connection has closed. The verdict is then on its way, and its wait ends as soon as it is
#: told; an answer without it would be ``[]``, which ``shrink_group`` refuses, so the bound
#: is longer than an op's 1 s (under load, telling the loss to every group can take longer).
_VERDICT_GRACE_S, _VERDICT_WAIT_S = 0.2, 10.0


def supports_shrinking(pg: Any) -> bool:
    """Whether torch may shrink ``pg`` (a ``ProcessGroupNdist``): its ndist backend is
    ``socket`` (the mpi backend would need MPI's ULFM, unusable with mpi4py 4.1.2 over MPICH 5.0.2:
    docs/errors.md, "Rank loss"; torch raises ``TypeError`` for it, as for Gloo)."""
    return pg.ndist_backend in _SHRINKABLE_BACKENDS


def backend_for(pg: Any, device: Any) -> Any:
    """``pg._get_backend(device)``: the group itself for cpu, the only device it serves."""
    dev = torch.device(device)
    if dev.type != "cpu":
        raise RuntimeError(f"No backend type associated with device type {dev.type} (backend 'ndist' serves cpu "
                           "tensors only)")
    return pg


def shrink(pg: Any, ranks_to_exclude: Any, shrink_flags: int = 0, pg_options: Any = None) -> Any:
    """A new ``type(pg)`` of ``pg``'s members less ``ranks_to_exclude`` (group ranks),
    renumbered in order, agreed with every other survivor (see the module doc)."""
    nd = pg.ndist_group
    if pg_options is not None and not isinstance(pg_options, type(nd.options)):
        raise TypeError(f"pg_options: expected {type(nd.options).__module__}.{type(nd.options).__name__} or None, "
                        f"got {type(pg_options).__name__}")
    options = pg_options if pg_options is not None else nd.options
    backend = options.resolved_backend() if pg_options is not None else pg.ndist_backend
    wanted: Any = list(ranks_to_exclude) if ranks_to_exclude is not None else None
    name = pg.getGroupName()
    try:
        wanted, flags = check_request(nd, wanted, shrink_flags)
        if _watch.is_default(nd):  # a survivor blocked in another group on this one is released
            _watch.begin_default_shrink(nd)
        first = nd  # the group torch destroys once this returns (``_finalize_shrunk_group``)
        while True:
            count, excluded = agree_exclusion(nd, wanted, flags)
            keep = [r for r in range(nd.size()) if r not in excluded]
            kept_global = tuple(nd.ranks[r] for r in keep)
            nd.note_kept(kept_global)  # (a member a connection failure made this rank think lost)
            # the excluded are lost to the group torch then closes: what is pending there on
            # them fails now, naming them, instead of holding up its close for the group
            # timeout (this rank's watch may not have told it yet; another survivor's saw
            # them go). An agreement repeated below numbers them as ``first`` does (a group
            # shrunk here keeps its parent's numbering).
            note_excluded(first, {first.group_rank(nd.ranks[r]) for r in excluded})
            store = PrefixStore(f"shrink{count}", nd.store)
            name = f"{name}:shrink{count}"
            lost = _lost(nd, kept_global)
            if not lost:
                break
            # A member it keeps died during the agreement: the new group would be revoked
            # at birth. Its survivors shrink it at once, in its own store namespace (where a
            # survivor that learns of the loss later meets them), before any connection.
            parent = nd
            nd = NdistGroup(kept_global, nd.ranks[nd.rank()], f"torch-{name}", store, nd.backend_names,
                            nd.timeout, options)
            nd.numbering = parent.numbering
            _watch.adopt_shrunk(nd, parent)  # (a loss the watch tells from now on reaches it too)
            for grank, (host, cause) in lost.items():
                nd.note_loss(grank, host, cause)
            log.info("torch group %r: members %s of the shrunk group were lost during the agreement; shrinking it "
                     "again", name, sorted(lost))
            wanted, flags = None, 0
        new = type(pg)(store, keep.index(nd.rank()), len(keep), nd.timeout, name, kept_global, backend, options,
                       numbering=nd.numbering)  # (it keeps the parent's numbering)
        _watch.adopt_shrunk(new.ndist_group, nd)
    except DistError as exc:
        raise as_torch_error(exc) from exc
    log.info("torch group %r shrunk to %r: excluded group ranks %s; this rank is %d of %d", pg.getGroupName(),
             name, sorted(excluded), new.rank(), new.size())
    return new


def shrink_compiled(pg: Any, ranks_to_exclude: Any, shrink_flags: int = 0, pg_options: Any = None) -> Any:
    """The compiled backend's ``shrink`` (csrc/ndist_backend.cpp): ``shrink`` of its Python group
    ``pg``, and a compiled backend over the result."""
    new = shrink(pg, ranks_to_exclude, shrink_flags, pg_options)
    return _compiled.wrap_group(new)


def _lost(nd: NdistGroup, kept_global: tuple) -> dict:
    """The members of ``kept_global`` whose process the member watch saw go (died during
    the agreement): global rank -> (host, cause). Not one a connection failure made ``nd``
    record lost: the agreement kept it, as it may be alive (``ProcessGroup.watched_losses``;
    a group the watch does not cover: its own record)."""
    watched = nd.watched_losses() if nd.watched_losses is not None else nd.lost_members()
    return {g: (host, cause) for g, (host, cause, _detail) in watched.items() if g in kept_global}


def _finalize_shrunk_group(original: Any, group_info: dict, excluded_ranks_set: set, new_backend: Any) -> Any:
    """torch's last step of ``shrink_group``, for what backend "ndist" returned from ``shrink``.

    A compiled backend (a C++ ``Backend``) goes through torch's own step, which builds a new
    torch group over a clone of the old group's store and registers it as its cpu backend,
    with two changes: the member watch is told first when the default group shrinks, and the
    excluded ranks are passed as global ranks (torch's step drops the *global* ranks equal to
    the *group* ranks it is given, wrong for any group whose group ranks are not its global
    ranks: a subgroup, or a default group shrunk before).

    A Python group (``ProcessGroupNdist``): the same steps as torch 2.13's and 2.14's
    (destroy the other groups when the default one shrinks, destroy the old group, make and
    register the new one) except that the new group is ``new_backend`` itself (see the module
    doc), with the ranks as above. Anything else goes to torch's function unchanged."""
    target, is_default = group_info["process_group"], group_info["is_default_group"]
    compiled = _compiled.backend_group(new_backend)
    if compiled is not None:
        ranks = c10d.get_process_group_ranks(target)
        if is_default:  # (first: destroying the old default group must not end the member watch)
            _watch.default_shrunk(compiled.ndist_group)
        new_pg = original(group_info, {ranks[i] for i in excluded_ranks_set}, new_backend)
        # torch registers the new backend as GLOO on a CPU device, and DDP's C++ logger then
        # treats a GLOO group's backend as ProcessGroupGloo (gloo_num_threads): a SIGSEGV on
        # our backend. Registered as what it is, a custom backend, the group names it so.
        cpu = torch.device("cpu")
        new_pg._register_backend(cpu, tdist.ProcessGroup.BackendType.CUSTOM, new_backend)
        new_pg._set_default_backend(tdist.ProcessGroup.BackendType.CUSTOM)
        return new_pg
    if not isinstance(new_backend, tdist.ProcessGroup):
        return original(group_info, excluded_ranks_set, new_backend)
    if is_default:
        # (first: destroying the old default group below must not end the member watch)
        _watch.default_shrunk(new_backend.ndist_group)
        c10d._destroy_all_other_groups(exclude_group=target)
    meta = c10d._extract_group_metadata(target)
    remaining = [g for i, g in enumerate(c10d.get_process_group_ranks(target)) if i not in excluded_ranks_set]
    c10d._cleanup_original_group(target, is_default)
    new_backend._set_group_name(meta["new_group_name"])
    new_backend._set_group_desc("default:shrunken" if is_default else f"{meta['original_group_name']}:shrunk")
    if is_default:
        c10d._update_default_pg(new_backend)
    c10d._register_pg_in_world(pg=new_backend, backend_name=meta["backend_name"], store=meta["store"],
                               group_name=meta["new_group_name"], backend_config=meta["backend_config"],
                               rank_mapping={g: i for i, g in enumerate(remaining)})
    return new_backend


def install() -> None:
    """Wrap torch's ``_finalize_shrunk_group`` (once) so that a Python group returned by
    a backend's ``shrink`` becomes the new group itself; anything else goes to torch's."""
    current = getattr(c10d, "_finalize_shrunk_group", None)
    if current is None or getattr(current, "_ndist_wrapped", False):
        return
    wrapped = functools.partial(_finalize_shrunk_group, current)
    wrapped._ndist_wrapped = True  # type: ignore[attr-defined]
    c10d._finalize_shrunk_group = wrapped


def get_failed_ranks(group: Any = None) -> list[int]:
    """The ranks (in ``group``, a torch group on backend ``"ndist"``; None: the default
    group) of the members whose process the job's member watch saw end, sorted; ``[]``
    while it knows of none. What a survivor passes to ``torch.distributed.shrink_group``.

    Not a member the group recorded lost only because a connection to it failed (a link
    reset): it may be alive and call ``shrink_group`` too, and the agreement refuses to
    exclude it. A member recorded lost that the watch has not told of yet is given the
    watch's verdict first (``ProcessGroup.loss_verdict``, as an op's error does): at once
    when its process ended, 0.2 s while its watch connection stays open (alive)."""
    pg = group if group is not None else c10d._get_default_group()
    nd = getattr(_compiled.python_group(pg), "ndist_group", None)  # (a compiled backend's group too)
    if nd is None:
        raise TypeError(f"group: expected a torch process group on backend 'ndist' (or None: the default group), "
                        f"got {pg!r}")
    if nd.watched_losses is None or nd.loss_verdict is None:  # (no watch covers it: its own record)
        return nd.failed_ranks()
    watched = nd.watched_losses()
    for g in nd.lost_members():
        if g not in watched and nd.loss_verdict(g, _VERDICT_GRACE_S, min(_VERDICT_WAIT_S,
                                                                         nd.timeout.total_seconds())):
            watched = nd.watched_losses()
    return sorted(nd.group_rank(g) for g in watched if g in nd.ranks)
