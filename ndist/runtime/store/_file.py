"""FileStore: a store in a file on a file system every rank can see.

The file is an append-only log of records (``set key value`` / ``delete
key``) guarded by ``flock``; each FileStore replays only the bytes appended
since it last looked. Waits poll with a short back-off until their deadline.
As in torch, every FileStore registers itself as a user of the file; with a
known ``world_size`` the last of ``world_size`` users to close removes it.
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from typing import Sequence

from .._errors import DistStoreError, DistTimeoutError
from ._base import Store, as_bytes, as_timedelta, check_key

__all__ = ["FileStore"]

_HEAD = struct.Struct("!BII")  # op, key length, value length
_SET, _DELETE = 0, 1
_INTERNAL = "\0ndist/"
_USERS = _INTERNAL + "users"
_FINISHED = _INTERNAL + "finished"


class FileStore(Store):
    """A store backed by the file at ``path`` (created if absent), as ``torch.distributed.FileStore``.

    ``world_size`` is the number of processes that will use the file (-1:
    unknown, and the file is never removed).
    """

    def __init__(self, path: str | os.PathLike, world_size: int = -1, timeout: timedelta | float | None = None) -> None:
        super().__init__(timeout)
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise TypeError(f"path: expected a file path (str or PathLike), got {path!r}")
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size == 0 or world_size < -1:
            raise ValueError(f"world_size: expected a positive int or -1, got {world_size!r}")
        self.path = os.fspath(path)
        self.world_size = world_size
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as err:
            raise DistStoreError(f"FileStore cannot open {self.path!r}: {err}") from None
        self._tlock = threading.RLock()
        self._offset = 0
        self._data: dict[str, bytes] = {}
        self._pid = os.getpid()
        self._closed = False
        self._add(_USERS, 1)

    def __repr__(self) -> str:
        return f"<FileStore {self.path!r}>"

    # -------------------------------------------------------------- plumbing
    @contextmanager
    def _locked(self):
        if self._closed:
            raise DistStoreError(f"FileStore {self.path!r} is closed")
        with self._tlock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                self._refresh()
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _refresh(self) -> None:
        size = os.fstat(self._fd).st_size
        if size < self._offset:
            raise DistStoreError(f"FileStore {self.path!r} was truncated by another process")
        if size == self._offset:
            return
        buf = os.pread(self._fd, size - self._offset, self._offset)
        pos = 0
        while pos + _HEAD.size <= len(buf):
            op, klen, vlen = _HEAD.unpack_from(buf, pos)
            end = pos + _HEAD.size + klen + vlen
            if end > len(buf):
                break  # a record being written without the lock? never: keep it for later
            key = buf[pos + _HEAD.size : pos + _HEAD.size + klen].decode()
            if op == _SET:
                self._data[key] = buf[pos + _HEAD.size + klen : end]
            elif op == _DELETE:
                self._data.pop(key, None)
            else:
                raise DistStoreError(f"FileStore {self.path!r} is corrupt (record type {op} at byte {self._offset + pos})")
            pos = end
        self._offset += pos

    def _write(self, op: int, key: str, value: bytes = b"") -> None:
        k = key.encode()
        record = _HEAD.pack(op, len(k), len(value)) + k + value
        end = os.fstat(self._fd).st_size
        view = memoryview(record)
        while view:
            n = os.pwrite(self._fd, view, end)
            view, end = view[n:], end + n
        self._refresh()

    def _add(self, key: str, amount: int) -> int:
        with self._locked():
            value = int(self._data.get(key, b"0")) + amount
            self._write(_SET, key, str(value).encode())
            return value

    # ------------------------------------------------------------ Store API
    def set(self, key, value):
        check_key(key)
        value = as_bytes(value)
        with self._locked():
            self._write(_SET, key, value)

    def get(self, key):
        self.wait([check_key(key)])
        with self._locked():
            try:
                return self._data[key]
            except KeyError:
                raise DistStoreError(f"FileStore {self.path!r}: key {key!r} was deleted while being read") from None

    def add(self, key, amount):
        check_key(key)
        if not isinstance(amount, int) or isinstance(amount, bool):
            raise TypeError(f"amount: expected int, got {type(amount).__name__}")
        try:
            return self._add(key, amount)
        except ValueError:
            raise DistStoreError(f"FileStore {self.path!r}: add: the value at key {key!r} is not an integer") from None

    def compare_set(self, key, expected, desired):
        check_key(key)
        expected, desired = as_bytes(expected, "expected"), as_bytes(desired, "desired")
        with self._locked():
            current = self._data.get(key)
            if (current is None and expected == b"") or current == expected:
                self._write(_SET, key, desired)
                return desired
            return current if current is not None else expected

    def wait(self, keys: Sequence[str], timeout=None):
        if isinstance(keys, str):
            raise TypeError(f"keys: expected a list of str, got str {keys!r}")
        keys = [check_key(k) for k in keys]
        seconds = as_timedelta(timeout, self.timeout).total_seconds()
        deadline = time.monotonic() + seconds
        delay = 0.001
        while True:
            with self._locked():
                missing = [k for k in keys if k not in self._data]
            if not missing:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise DistTimeoutError(
                    f"store wait timed out after {seconds:g} s; missing keys: {missing} (FileStore {self.path!r})"
                )
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.05)

    def check(self, keys):
        if isinstance(keys, str):
            raise TypeError(f"keys: expected a list of str, got str {keys!r}")
        keys = [check_key(k) for k in keys]
        with self._locked():
            return all(k in self._data for k in keys)

    def delete_key(self, key):
        check_key(key)
        with self._locked():
            if key not in self._data:
                return False
            self._write(_DELETE, key)
            return True

    def num_keys(self):
        with self._locked():
            return sum(1 for k in self._data if not k.startswith(_INTERNAL))

    def append(self, key, value):
        check_key(key)
        value = as_bytes(value)
        with self._locked():
            self._write(_SET, key, self._data.get(key, b"") + value)

    def close(self) -> None:
        """Unregister as a user; the last of ``world_size`` users removes the file."""
        if self._closed or os.getpid() != self._pid:
            return
        try:
            with self._locked():
                finished = int(self._data.get(_FINISHED, b"0")) + 1
                users = int(self._data.get(_USERS, b"0")) - 1
                self._write(_SET, _FINISHED, str(finished).encode())
                self._write(_SET, _USERS, str(users).encode())
                if users == 0 and self.world_size > 0 and finished >= self.world_size:
                    try:
                        os.unlink(self.path)
                    except FileNotFoundError:
                        pass
        finally:
            self._closed = True
            os.close(self._fd)

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass
