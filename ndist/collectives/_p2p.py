"""Point-to-point: send / recv / isend / irecv, P2POp and batch_isend_irecv.

``dst`` / ``src`` are global ranks (``group_dst`` / ``group_src``: ranks in
``group``); ``recv`` with no source receives from any rank and returns the
sender's global rank (its group rank when ``group_src``-style addressing is
wanted, use ``group.group_rank``).
"""

from __future__ import annotations

import contextlib
from typing import Any

from . import _check
from ..runtime import DistRankFailureError, resolve_group
from ._backend import Call, Op
from ._common import backend_of, member_group, submit, wait_sync
from ._convert import contiguous_input, contiguous_output, device_type

__all__ = ["send", "recv", "isend", "irecv", "P2POp", "batch_isend_irecv"]


def _send(tensor, dst, group, tag, group_dst, async_op):
    pg = member_group(group, "send")
    if pg is None:
        return None
    peer = _check.peer_rank(pg, "dst", dst, "group_dst", group_dst)
    arr = _check.tensor(tensor, "tensor")
    tag = _check.check_tag(tag)
    dev = device_type(arr)
    buf = contiguous_input(arr)
    call = Call(Op.SEND, dev, buf.dtype, out=buf, root=peer, tag=tag)
    return submit(pg, backend_of(pg, call).send, call, async_op, None, [tensor])


def _recv(tensor, src, group, tag, group_src, async_op):
    pg = member_group(group, "recv")
    if pg is None:
        return None if async_op else -1  # torch: recv on a non-member group returns -1
    peer = _check.peer_rank(pg, "src", src, "group_src", group_src, allow_none=True)
    arr = _check.output(tensor, "tensor")
    tag = _check.check_tag(tag)
    async_op = _check.check_bool("async_op", async_op)
    dev = device_type(arr)
    post: list = []
    buf = contiguous_output(arr, post)
    call = Call(Op.RECV, dev, buf.dtype, out=buf, root=peer, tag=tag)
    # Always a Work from submit: it carries the sender's rank (``result()``), known
    # only at completion; write-backs chained by then() keep it.
    work = submit(pg, backend_of(pg, call).recv, call, True, post)
    if async_op:
        return work
    wait_sync(work, pg)
    (source,) = work.result()
    return pg.global_rank(source)


def send(tensor, dst=None, group=None, tag=0, group_dst=None) -> None:
    """Send ``tensor`` to global rank ``dst`` (or ``group_dst``); returns once it is handed off."""
    _send(tensor, dst, group, tag, group_dst, False)


def recv(tensor, src=None, group=None, tag=0, group_src=None) -> int:
    """Receive into ``tensor`` from ``src`` (any rank when None); return the sender's global rank."""
    return _recv(tensor, src, group, tag, group_src, False)


def isend(tensor, dst=None, group=None, tag=0, group_dst=None):
    """Start sending ``tensor``; returns a Work."""
    return _send(tensor, dst, group, tag, group_dst, True)


def irecv(tensor, src=None, group=None, tag=0, group_src=None):
    """Start receiving into ``tensor``; returns a Work whose ``result()`` is ``[sender group rank]``."""
    return _recv(tensor, src, group, tag, group_src, True)


class P2POp:
    """One point-to-point operation for ``batch_isend_irecv`` (``op`` is ``isend`` or ``irecv``)."""

    __slots__ = ("op", "tensor", "peer", "group", "tag", "group_peer")

    def __init__(self, op, tensor, peer=None, group=None, tag=0, group_peer=None):
        if op not in (isend, irecv):
            raise ValueError(f"op: expected ndist.distributed.isend or irecv, got {op!r}")
        if peer is None and group_peer is None:
            raise ValueError("peer: expected a global rank (or group_peer), got None")
        self.op = op
        self.tensor = tensor
        self.peer = peer
        self.group = group
        self.tag = tag
        self.group_peer = group_peer

    def __repr__(self) -> str:
        return f"P2POp({self.op.__name__}, peer={self.peer}, group_peer={self.group_peer}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list: Any) -> list:
    """Start every operation of ``p2p_op_list`` and return their Works, in order.

    All operations are checked before the first one starts.
    """
    if isinstance(p2p_op_list, (str, bytes)) or not isinstance(p2p_op_list, (list, tuple)):
        raise TypeError(f"p2p_op_list: expected a list of P2POp, got {type(p2p_op_list).__name__}")
    if not p2p_op_list:
        raise ValueError("p2p_op_list: expected a non-empty list of P2POp, got []")
    places = set()
    for i, p in enumerate(p2p_op_list):
        if not isinstance(p, P2POp):
            raise TypeError(f"p2p_op_list[{i}]: expected a P2POp, got {type(p).__name__}")
        pg = member_group(p.group, "batch_isend_irecv")
        if pg is None:
            raise ValueError(f"p2p_op_list[{i}].group: this process is not a member of group "
                             f"{resolve_group(p.group).group_name!r}")
        if p.op is isend:
            _check.peer_rank(pg, f"p2p_op_list[{i}].peer", p.peer, "group_peer", p.group_peer)
            arr = _check.tensor(p.tensor, f"p2p_op_list[{i}].tensor")
        else:
            _check.peer_rank(pg, f"p2p_op_list[{i}].peer", p.peer, "group_peer", p.group_peer)
            arr = _check.output(p.tensor, f"p2p_op_list[{i}].tensor")
        _check.check_tag(p.tag)
        places.add((pg, _check.same_device([(f"p2p_op_list[{i}].tensor", arr)])))
    # A backend that can group point-to-point ops (nccl: one NCCL group, as torch
    # does) gets the whole batch in one block, so opposite sends cannot deadlock.
    block = contextlib.nullcontext()
    if len(places) == 1:
        ((pg, dev),) = places
        try:
            backend = pg.backend_for(dev)
        except DistRankFailureError:  # revoked: each op's submit records its refusal and raises it
            backend = None
        if backend is not None and backend.coalesces:
            block = backend.coalescing()
    works = []
    with block:
        for p in p2p_op_list:
            if p.op is isend:
                works.append(isend(p.tensor, p.peer, p.group, p.tag, p.group_peer))
            else:
                works.append(irecv(p.tensor, p.peer, p.group, p.tag, p.group_peer))
    return works
