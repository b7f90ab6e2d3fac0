"""``ndist.device``: where a tensor's storage lives ('cpu', 'cuda', 'cuda:N')."""

from __future__ import annotations

from typing import Any

__all__ = ["device"]

_VALID = "'cpu', 'cuda', 'cuda:N' (N >= 0), device('cuda', N) or an int N (meaning 'cuda:N')"
_TYPES = ("cpu", "cuda")


def _bad(value: Any) -> ValueError:
    return ValueError(f"device: expected {_VALID}, got {value!r}")


class device:
    """A device: ``type`` ('cpu' or 'cuda') and ``index`` (None = the current one).

    ``device('cuda')`` means the current CUDA device at the time a tensor is
    made; a tensor's own ``.device`` always carries the concrete index.
    """

    __slots__ = ("_type", "_index")

    def __init__(self, type: Any, index: int | None = None) -> None:  # noqa: A002 - torch's name
        if isinstance(type, device):
            if index is not None:
                raise TypeError("device: index must not be given together with a device")
            self._type, self._index = type._type, type._index
            return
        if isinstance(type, int) and not isinstance(type, bool):
            if index is not None:
                raise TypeError("device: index must not be given together with an int ordinal")
            type, index = "cuda", type
        elif not isinstance(type, str):
            raise TypeError(f"device: expected a str, int or ndist.device, got {type!r} "
                            f"of type {builtins_type(type).__name__}")
        elif ":" in type:
            if index is not None:
                raise ValueError(f"device: {type!r} already has an index, and index={index!r} "
                                 f"was given too; expected {_VALID}")
            kind, _, text = type.partition(":")
            if not text.isdigit():  # also rejects '-1', '', 'x'
                raise _bad(type)
            type, index = kind, int(text)
        if type not in _TYPES:
            raise _bad(type if index is None else f"{type}:{index}")
        if index is not None:
            if isinstance(index, bool) or not isinstance(index, int):
                raise TypeError(f"device: index must be an int, got {index!r}")
            if index < 0:
                raise _bad(f"{type}:{index}")
            if type == "cpu" and index != 0:
                raise ValueError(f"device: the cpu device has only index 0, got 'cpu:{index}'")
        self._type = type
        self._index = index

    @property
    def type(self) -> str:  # noqa: A003 - torch's name
        return self._type

    @property
    def index(self) -> int | None:
        return self._index

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, device):
            return NotImplemented
        return self._type == other._type and self._index == other._index

    def __hash__(self) -> int:
        return hash((self._type, self._index))

    def __str__(self) -> str:
        return self._type if self._index is None else f"{self._type}:{self._index}"

    def __repr__(self) -> str:
        if self._index is None:
            return f"device(type={self._type!r})"
        return f"device(type={self._type!r}, index={self._index})"

    def __reduce__(self):
        return (device, (self._type, self._index))


builtins_type = type
CPU = device("cpu")


def to_device(value: Any, *, arg: str = "device") -> device:
    """Parse what factories accept for ``device=`` (None -> cpu)."""
    if value is None:
        return CPU
    if isinstance(value, device):
        return value
    try:
        return device(value)
    except ValueError as exc:
        raise ValueError(str(exc).replace("device:", f"{arg}:", 1)) from None
    except TypeError as exc:
        raise TypeError(str(exc).replace("device:", f"{arg}:", 1)) from None
