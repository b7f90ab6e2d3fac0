"""Object collectives: picklable Python objects over the tensor collectives.

Objects are serialised with cloudpickle into uint8 arrays; sizes travel
first (int64), then the bytes, through the same backend calls as tensors, so
every backend gets them. Because ndist's list collectives accept uneven
sizes, nothing is padded. Only frames from the job's authenticated peers are
unpickled (every backend connection is authenticated with the job secret).
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from . import _api, _p2p
from ._common import member_group
from . import _check

__all__ = [
    "broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list",
    "send_object_list", "recv_object_list",
]


def _dumps(obj: Any) -> np.ndarray:
    import cloudpickle

    return np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8)


def _loads(buf: np.ndarray) -> Any:
    return pickle.loads(buf.tobytes())


def _check_list(name: str, value: Any) -> list:
    if not isinstance(value, list):
        raise TypeError(f"{name}: expected a list, got {type(value).__name__}")
    return value


def _check_device(device: Any) -> None:
    if device is not None and str(device).split(":")[0] not in ("cpu", "cuda"):
        raise ValueError(f"device: expected None, 'cpu' or 'cuda[:i]', got {device!r}")


def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None) -> None:
    """Replace ``object_list``'s items on every rank by ``src``'s items (same length everywhere)."""
    pg = member_group(group, "broadcast_object_list")
    if pg is None:
        return None
    root = _check.root_rank(pg, "src", src, "group_src", group_src)
    _check_list("object_list", object_list)
    _check_device(device)
    n = len(object_list)
    if pg.rank() == root:
        payloads = [_dumps(o) for o in object_list]
        sizes = np.array([p.size for p in payloads], np.int64)
    else:
        sizes = np.zeros(n, np.int64)
    _api.broadcast(sizes, group=group, group_src=root)
    data = np.concatenate(payloads) if pg.rank() == root and n else np.empty(int(sizes.sum()), np.uint8)
    _api.broadcast(data, group=group, group_src=root)
    if pg.rank() != root:
        pos = 0
        for i, size in enumerate(sizes.tolist()):
            object_list[i] = _loads(data[pos:pos + size])
            pos += size


def all_gather_object(object_list, obj, group=None) -> None:
    """``object_list[i]`` = rank i's ``obj``; ``object_list`` must have the group's size."""
    pg = member_group(group, "all_gather_object")
    if pg is None:
        return None
    _check_list("object_list", object_list)
    if len(object_list) != pg.size():
        raise ValueError(f"object_list: expected a list of {pg.size()} items (the group size), "
                         f"got {len(object_list)}")
    payload = _dumps(obj)
    sizes = [np.zeros(1, np.int64) for _ in range(pg.size())]
    _api.all_gather(sizes, np.array([payload.size], np.int64), group=group)
    outs = [np.empty(int(s[0]), np.uint8) for s in sizes]
    _api.all_gather(outs, payload, group=group)
    for i, out in enumerate(outs):
        object_list[i] = _loads(out)


def gather_object(obj, object_gather_list=None, dst=None, group=None, group_dst=None) -> None:
    """On ``dst``, ``object_gather_list[i]`` = rank i's ``obj``; None / absent elsewhere."""
    pg = member_group(group, "gather_object")
    if pg is None:
        return None
    root = _check.root_rank(pg, "dst", dst, "group_dst", group_dst, default=0)
    is_root = pg.rank() == root
    if is_root:
        _check_list("object_gather_list", object_gather_list)
        if len(object_gather_list) != pg.size():
            raise ValueError(f"object_gather_list: expected a list of {pg.size()} items on the destination "
                             f"rank, got {len(object_gather_list)}")
    payload = _dumps(obj)
    sizes = [np.zeros(1, np.int64) for _ in range(pg.size())]
    _api.all_gather(sizes, np.array([payload.size], np.int64), group=group)
    outs = [np.empty(int(s[0]), np.uint8) for s in sizes] if is_root else None
    _api.gather(payload, outs, group=group, group_dst=root)
    if is_root:
        for i, out in enumerate(outs):
            object_gather_list[i] = _loads(out)


def scatter_object_list(scatter_object_output_list, scatter_object_input_list=None, src=None, group=None,
                        group_src=None) -> None:
    """``scatter_object_output_list[0]`` = ``src``'s ``scatter_object_input_list[rank]``."""
    pg = member_group(group, "scatter_object_list")
    if pg is None:
        return None
    root = _check.root_rank(pg, "src", src, "group_src", group_src, default=0)
    out_list = _check_list("scatter_object_output_list", scatter_object_output_list)
    if len(out_list) < 1:
        raise ValueError("scatter_object_output_list: expected a list with at least one element, got []")
    is_root = pg.rank() == root
    if is_root:
        _check_list("scatter_object_input_list", scatter_object_input_list)
        if len(scatter_object_input_list) != pg.size():
            raise ValueError(f"scatter_object_input_list: expected {pg.size()} items (the group size) on the "
                             f"source rank, got {len(scatter_object_input_list)}")
        payloads = [_dumps(o) for o in scatter_object_input_list]
        sizes = [np.array([p.size], np.int64) for p in payloads]
    mine = np.zeros(1, np.int64)
    _api.scatter(mine, sizes if is_root else None, group=group, group_src=root)
    data = np.empty(int(mine[0]), np.uint8)
    _api.scatter(data, payloads if is_root else None, group=group, group_src=root)
    out_list[0] = _loads(data)


def send_object_list(object_list, dst=None, group=None, device=None, group_dst=None) -> None:
    """Send the objects of ``object_list`` to ``dst`` (sizes, then bytes)."""
    pg = member_group(group, "send_object_list")
    if pg is None:
        return None
    peer = _check.peer_rank(pg, "dst", dst, "group_dst", group_dst)
    _check_list("object_list", object_list)
    _check_device(device)
    payloads = [_dumps(o) for o in object_list]
    sizes = np.array([p.size for p in payloads], np.int64)
    _p2p.send(sizes, group=group, group_dst=peer)
    _p2p.send(np.concatenate(payloads) if payloads else np.empty(0, np.uint8), group=group, group_dst=peer)


def recv_object_list(object_list, src=None, group=None, device=None, group_src=None) -> int:
    """Fill ``object_list`` with objects sent by ``src`` (any rank when None); return the sender's rank."""
    pg = member_group(group, "recv_object_list")
    if pg is None:
        return -1
    peer = _check.peer_rank(pg, "src", src, "group_src", group_src, allow_none=True)
    _check_list("object_list", object_list)
    _check_device(device)
    sizes = np.zeros(len(object_list), np.int64)
    sender = _p2p.recv(sizes, group=group, group_src=peer)
    data = np.empty(int(sizes.sum()), np.uint8)
    _p2p.recv(data, src=sender, group=group)
    pos = 0
    for i, size in enumerate(sizes.tolist()):
        object_list[i] = _loads(data[pos:pos + size])
        pos += size
    return sender
