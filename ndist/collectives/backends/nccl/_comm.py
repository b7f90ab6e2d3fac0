"""Creating the NCCL communicator: unique id through the store, then ncclCommInitRank."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from ....runtime import BackendContext

__all__ = ["uid_to_bytes", "uid_from_bytes", "exchange_unique_id", "init_communicator", "device_from_options",
           "communicator_device"]

log = logging.getLogger("ndist.collectives.nccl")

UID_KEY = "nccl_uid"
UID_BYTES = 128  # NCCL_UNIQUE_ID_BYTES


def uid_to_bytes(uid: Any) -> bytes:
    """CuPy >= 14 returns bytes; older CuPy a tuple of C ``char`` values (signed on x86)."""
    if isinstance(uid, (bytes, bytearray)):
        raw = bytes(uid)
    else:
        raw = bytes(int(b) & 0xFF for b in uid)
    if len(raw) != UID_BYTES:
        raise ValueError(f"nccl unique id: expected {UID_BYTES} bytes, got {len(raw)}")
    return raw


def uid_from_bytes(raw: bytes, signed: bool = True) -> tuple[int, ...]:
    """The tuple form older CuPy's ``NcclCommunicator`` takes (``char`` values)."""
    if signed:
        return tuple(b - 256 if b > 127 else b for b in raw)
    return tuple(raw)


def device_from_options(options: Any) -> int | None:
    """``ctx.options`` may name the CUDA device: an int, a mapping or an object with ``device_id``."""
    if options is None:
        return None
    if isinstance(options, bool):
        raise TypeError(f"options: expected a device id (int), mapping or object with device_id, got {options!r}")
    if isinstance(options, int):
        return options
    if isinstance(options, dict):
        value = options.get("device_id")
    else:
        value = getattr(options, "device_id", None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"options.device_id: expected an int, got {type(value).__name__}")
    return value


def communicator_device(ctx: BackendContext) -> int | None:
    """The CUDA ordinal the communicator is created on; None: the device current at construction.

    ``ctx.options`` naming a device wins (this backend's own option); then
    ``ctx.device_index``, which the process group sets to the bound
    ``device_id`` or, without one, the rank's current device, which on a rank
    started by a launcher that chose none is ``LOCAL_RANK % device_count()``
    (``ndist/runtime/_device.py``).
    """
    dev = device_from_options(ctx.options)
    return dev if dev is not None else ctx.device_index


def _seconds(timeout: timedelta | float) -> float:
    return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)


def exchange_unique_id(ctx: BackendContext, make_uid) -> bytes:
    """Rank 0 publishes a fresh unique id; every rank returns it once all ranks arrived.

    The arrival check runs through the store with the group timeout, so that a
    missing rank is a ``DistTimeoutError`` naming its key (``nccl_joined/<rank>``)
    instead of a hang inside ``ncclCommInitRank``, which has no timeout.
    """
    store = ctx.store
    timeout = ctx.timeout
    if ctx.rank == 0:
        store.set(UID_KEY, uid_to_bytes(make_uid()))
    store.set(f"nccl_joined/{ctx.rank}", b"1")
    store.wait([UID_KEY] + [f"nccl_joined/{r}" for r in range(ctx.size)], timeout)
    raw = store.get(UID_KEY)
    if len(raw) != UID_BYTES:
        raise ValueError(f"store key {UID_KEY!r}: expected {UID_BYTES} bytes, got {len(raw)}")
    return raw


def init_communicator(nccl: Any, size: int, raw_uid: bytes, rank: int) -> Any:
    """``NcclCommunicator(size, uid, rank)`` with the uid in the form this CuPy takes."""
    try:
        return nccl.NcclCommunicator(size, raw_uid, rank)  # CuPy >= 14: bytes
    except TypeError:
        pass
    try:
        return nccl.NcclCommunicator(size, uid_from_bytes(raw_uid, signed=True), rank)
    except OverflowError:  # platforms where C char is unsigned (aarch64)
        return nccl.NcclCommunicator(size, uid_from_bytes(raw_uid, signed=False), rank)
