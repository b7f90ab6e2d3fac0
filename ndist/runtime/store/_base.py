"""The Store interface: a small key-value store every rank of a job can reach.

Keys are ``str``; values are ``bytes`` (``str`` values are UTF-8 encoded on
the way in). Every blocking call honours the store's timeout (or the one
given) and raises ``DistTimeoutError`` naming the keys still missing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from datetime import timedelta
from typing import Iterable, Sequence

__all__ = ["Store", "DEFAULT_TIMEOUT", "as_bytes", "as_timedelta"]

DEFAULT_TIMEOUT = timedelta(seconds=300)


def as_bytes(value: bytes | bytearray | memoryview | str, name: str = "value") -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{name}: expected bytes or str, got {type(value).__name__}")


def as_timedelta(timeout: timedelta | float | int | None, default: timedelta = DEFAULT_TIMEOUT) -> timedelta:
    if timeout is None:
        return default
    if isinstance(timeout, timedelta):
        return timeout
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        return timedelta(seconds=timeout)
    raise TypeError(f"timeout: expected datetime.timedelta or seconds, got {type(timeout).__name__}")


def check_key(key: str) -> str:
    if not isinstance(key, str):
        raise TypeError(f"key: expected str, got {type(key).__name__}")
    return key


class Store(ABC):
    def __init__(self, timeout: timedelta | float | None = None) -> None:
        self._timeout = as_timedelta(timeout)

    @property
    def timeout(self) -> timedelta:
        return self._timeout

    def set_timeout(self, timeout: timedelta | float) -> None:
        self._timeout = as_timedelta(timeout)

    @abstractmethod
    def set(self, key: str, value: bytes | str) -> None: ...

    @abstractmethod
    def get(self, key: str) -> bytes:
        """Wait (up to the timeout) for ``key`` and return its value."""

    @abstractmethod
    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the integer at ``key`` (0 if absent); return the new value."""

    @abstractmethod
    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        """Set ``key`` to ``desired`` if its value is ``expected`` (or it is absent and
        ``expected`` is empty); return the value now stored."""

    @abstractmethod
    def wait(self, keys: Sequence[str], timeout: timedelta | float | None = None) -> None: ...

    @abstractmethod
    def check(self, keys: Sequence[str]) -> bool:
        """True if every key is present; never waits."""

    @abstractmethod
    def delete_key(self, key: str) -> bool: ...

    @abstractmethod
    def num_keys(self) -> int: ...

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        return [self.get(k) for k in keys]

    def multi_set(self, keys: Sequence[str], values: Iterable[bytes | str]) -> None:
        values = list(values)
        if len(keys) != len(values):
            raise ValueError(f"values: expected {len(keys)} values for {len(keys)} keys, got {len(values)}")
        for k, v in zip(keys, values):
            self.set(k, v)

    @abstractmethod
    def append(self, key: str, value: bytes | str) -> None:
        """Append to the value at ``key`` (creating it)."""

    def close(self) -> None:
        """Release connections (and stop a server this store owns)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
