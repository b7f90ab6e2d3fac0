"""PrefixStore: a namespace inside another store, as ``torch.distributed.PrefixStore``.

Every key ``k`` becomes ``f"{prefix}/{k}"`` in the underlying store, so groups
and backends sharing one store never see each other's keys.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from ._base import Store, check_key

__all__ = ["PrefixStore"]


class PrefixStore(Store):
    def __init__(self, prefix: str, store: Store) -> None:
        if not isinstance(prefix, str):
            raise TypeError(f"prefix: expected str, got {type(prefix).__name__}")
        if not isinstance(store, Store):
            raise TypeError(f"store: expected an ndist Store, got {type(store).__name__}")
        super().__init__(store.timeout)
        self.prefix = prefix
        self._store = store

    @property
    def underlying_store(self) -> Store:
        return self._store

    @property
    def timeout(self):
        return self._store.timeout

    def set_timeout(self, timeout) -> None:
        self._store.set_timeout(timeout)

    def _k(self, key: str) -> str:
        return f"{self.prefix}/{check_key(key)}"

    def _ks(self, keys: Sequence[str]) -> list[str]:
        if isinstance(keys, str):
            raise TypeError(f"keys: expected a list of str, got str {keys!r}")
        return [self._k(k) for k in keys]

    def set(self, key, value):
        self._store.set(self._k(key), value)

    def get(self, key):
        return self._store.get(self._k(key))

    def add(self, key, amount):
        return self._store.add(self._k(key), amount)

    def compare_set(self, key, expected, desired):
        return self._store.compare_set(self._k(key), expected, desired)

    def wait(self, keys: Sequence[str], timeout=None):
        self._store.wait(self._ks(keys), timeout)

    def check(self, keys):
        return self._store.check(self._ks(keys))

    def delete_key(self, key):
        return self._store.delete_key(self._k(key))

    def num_keys(self):
        return self._store.num_keys()

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        return self._store.multi_get(self._ks(keys))

    def multi_set(self, keys: Sequence[str], values: Iterable[bytes | str]) -> None:
        self._store.multi_set(self._ks(keys), values)

    def append(self, key, value):
        self._store.append(self._k(key), value)

    def close(self) -> None:
        """A PrefixStore does not own the store it wraps: nothing to release."""

    def __repr__(self) -> str:
        return f"<PrefixStore {self.prefix!r} over {self._store!r}>"
