"""``TorchStore``: torch's c10d Store seen through ndist's Store interface.

torch hands a backend's creator a store already prefixed for the group and
the device (``"<group>/cpu/"``); ndist's process group and backends rendezvous
through it, so an ndist process group inside torch needs no second
rendezvous. torch's store errors become ndist's: a wait that ran out of time
is ``DistTimeoutError`` naming the missing keys, anything else
``DistStoreError``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Iterable, Sequence

from ..runtime import DistStoreError, DistTimeoutError
from ..runtime.store import Store
from ..runtime.store._base import as_bytes, as_timedelta, check_key

__all__ = ["TorchStore"]


def _is_timeout(err: BaseException) -> bool:
    return "timeout" in str(err).lower() or "timed out" in str(err).lower()


class TorchStore(Store):
    """An ndist ``Store`` over a ``torch.distributed.Store`` (no copy of its keys)."""

    def __init__(self, store, timeout: timedelta | float | None = None) -> None:
        if timeout is None:
            try:
                timeout = store.timeout
            except Exception:  # noqa: BLE001 - a Python store may not have one
                timeout = None
        super().__init__(timeout)
        self._store = store

    @property
    def torch_store(self):
        """The wrapped ``torch.distributed.Store``."""
        return self._store

    def _fail(self, what: str, keys: Sequence[str], err: BaseException, seconds: float | None = None):
        if _is_timeout(err):
            span = f" within {seconds:g} s" if seconds is not None else ""
            return DistTimeoutError(f"store {what}: keys {list(keys)} not set{span} (torch store: {err})")
        return DistStoreError(f"store {what} {list(keys)} failed: {type(err).__name__}: {err}")

    def set(self, key, value):
        check_key(key)
        try:
            self._store.set(key, as_bytes(value))
        except RuntimeError as err:
            raise self._fail("set", [key], err) from err

    def get(self, key):
        self.wait([check_key(key)])
        try:
            return bytes(self._store.get(key))
        except RuntimeError as err:
            raise self._fail("get", [key], err) from err

    def add(self, key, amount):
        check_key(key)
        if not isinstance(amount, int) or isinstance(amount, bool):
            raise TypeError(f"amount: expected int, got {type(amount).__name__}")
        try:
            return int(self._store.add(key, amount))
        except RuntimeError as err:
            raise self._fail("add", [key], err) from err

    def compare_set(self, key, expected, desired):
        check_key(key)
        try:
            return bytes(self._store.compare_set(key, as_bytes(expected, "expected"), as_bytes(desired, "desired")))
        except RuntimeError as err:
            raise self._fail("compare_set", [key], err) from err

    def wait(self, keys: Sequence[str], timeout: timedelta | float | None = None) -> None:
        keys = [check_key(k) for k in keys]
        limit = as_timedelta(timeout, self.timeout)
        try:
            self._store.wait(keys, limit)
        except RuntimeError as err:
            missing = [k for k in keys if not self._present(k)]
            raise self._fail("wait", missing or keys, err, limit.total_seconds()) from None

    def _present(self, key: str) -> bool:
        try:
            return bool(self._store.check([key]))
        except RuntimeError:
            return False

    def check(self, keys):
        keys = [check_key(k) for k in keys]
        try:
            return bool(self._store.check(keys))
        except RuntimeError as err:
            raise self._fail("check", keys, err) from err

    def delete_key(self, key):
        check_key(key)
        try:
            return bool(self._store.delete_key(key))
        except RuntimeError as err:
            raise self._fail("delete_key", [key], err) from err

    def num_keys(self):
        try:
            return int(self._store.num_keys())
        except RuntimeError as err:
            raise self._fail("num_keys", [], err) from err

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        keys = [check_key(k) for k in keys]
        self.wait(keys)
        try:
            return [bytes(v) for v in self._store.multi_get(keys)]
        except RuntimeError as err:
            raise self._fail("multi_get", keys, err) from err

    def multi_set(self, keys: Sequence[str], values: Iterable[bytes | str]) -> None:
        values = [as_bytes(v) for v in values]
        keys = [check_key(k) for k in keys]
        if len(keys) != len(values):
            raise ValueError(f"values: expected {len(keys)} values for {len(keys)} keys, got {len(values)}")
        try:
            self._store.multi_set(keys, values)
        except RuntimeError as err:
            raise self._fail("multi_set", keys, err) from err

    def append(self, key, value):
        check_key(key)
        try:
            self._store.append(key, as_bytes(value))
        except RuntimeError as err:
            raise self._fail("append", [key], err) from err

    def __repr__(self) -> str:
        return f"<TorchStore over {type(self._store).__name__}>"
