"""HashStore: an in-process store (threads of one process)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Sequence

from .._errors import DistTimeoutError
from ._base import Store, as_bytes, as_timedelta, check_key

__all__ = ["HashStore"]


class HashStore(Store):
    def __init__(self, timeout: timedelta | float | None = None) -> None:
        super().__init__(timeout)
        self._data: dict[str, bytes] = {}
        self._cond = threading.Condition()

    def set(self, key, value):
        check_key(key)
        value = as_bytes(value)
        with self._cond:
            self._data[key] = value
            self._cond.notify_all()

    def get(self, key):
        self.wait([check_key(key)])
        with self._cond:
            return self._data[key]

    def add(self, key, amount):
        check_key(key)
        if not isinstance(amount, int) or isinstance(amount, bool):
            raise TypeError(f"amount: expected int, got {type(amount).__name__}")
        with self._cond:
            value = int(self._data.get(key, b"0")) + amount
            self._data[key] = str(value).encode()
            self._cond.notify_all()
            return value

    def compare_set(self, key, expected, desired):
        check_key(key)
        expected, desired = as_bytes(expected, "expected"), as_bytes(desired, "desired")
        with self._cond:
            current = self._data.get(key)
            if (current is None and expected == b"") or current == expected:
                self._data[key] = desired
                self._cond.notify_all()
                return desired
            return current if current is not None else expected

    def wait(self, keys: Sequence[str], timeout=None):
        keys = [check_key(k) for k in keys]
        seconds = as_timedelta(timeout, self.timeout).total_seconds()
        deadline = time.monotonic() + seconds
        with self._cond:
            while True:
                missing = [k for k in keys if k not in self._data]
                if not missing:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DistTimeoutError(f"store wait timed out after {seconds:g} s; missing keys: {missing}")
                self._cond.wait(left)

    def check(self, keys):
        with self._cond:
            return all(check_key(k) in self._data for k in keys)

    def delete_key(self, key):
        with self._cond:
            return self._data.pop(check_key(key), None) is not None

    def num_keys(self):
        with self._cond:
            return len(self._data)

    def append(self, key, value):
        check_key(key)
        value = as_bytes(value)
        with self._cond:
            self._data[key] = self._data.get(key, b"") + value
            self._cond.notify_all()
