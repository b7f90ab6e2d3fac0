"""The engine's C interface from Python: a group's handle, and where its header is
(docs/native.md, "The C interface").

A C or C++ caller (the compiled torch backend, a custom op) gets the function table
``ndist_engine_api`` from the capsule ``_cnative._C_API`` and, once per group, the group's
handle from ``engine_handle``; ``engine_include_dir`` is the ``-I`` directory of
``ndist_engine.h``. Neither is in ``__all__``: ``ndist.distributed`` mirrors torch's names.
"""

from __future__ import annotations

import os

from . import _check, _debug
from ._common import _failed, member_group

__all__ = ["engine_handle", "engine_include_dir"]


def engine_handle(group=None) -> int:
    """The handle (an int, ``ndist_group`` in C) of ``group``'s native engine for the C
    interface; the same every time for one group, valid until the group is destroyed (then
    every call on it returns ``NDIST_E_CLOSED``). The group must have run a collective on the
    CPU (its first call sets it up, on the Python path) and run the native engine: over shared
    memory (every rank on one host), over TCP direct (up to 8 ranks across hosts, each alone on
    its host) or in two levels (shared memory inside each host, TCP among the hosts' leaders);
    otherwise ``ValueError`` says what it runs. A
    revoked group raises its ``DistRankFailureError``, a destroyed one ``ValueError``."""
    pg = member_group(group, "engine_handle")
    if pg is None:
        raise ValueError("group: expected a group this rank is a member of, got one it is not in")
    lane = pg.lanes.get("cpu")
    if lane is None:
        pg.require_alive()
        if pg.revoked and (failure := pg.failure()) is not None:  # (the layer above forgot its lanes)
            raise failure
        raise ValueError(f"group {pg.group_name!r}: expected a group that ran a collective on the CPU (its "
                         f"set-up), got one that has not")
    make = getattr(lane.backend, "engine_handle", None)
    if make is None:
        raise ValueError(f"group {pg.group_name!r}: expected a group on the socket backend's native engine, got "
                         f"backend {type(lane.backend).__name__}")
    return make(lane.book, _failed, _check.reduce_op, _debug.check_signature, _debug.T_DONE)


def engine_include_dir() -> str:
    """The directory that holds ``ndist_engine.h`` (a compiler's ``-I``): the native engine's
    folder, found by path so that asking imports no backend (``import ndist.collectives``
    registers the backends by name and loads none)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "backends", "socket", "native")
