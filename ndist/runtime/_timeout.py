"""The ``timeout`` argument every public call that takes one checks the same way:
``init_process_group``, ``new_group``, ``split_group``, ``monitored_barrier`` and
``grow_group`` (ndist's and ``ndist.torch``'s)."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

__all__ = ["check_timeout"]


def check_timeout(timeout: Any, default: timedelta) -> timedelta:
    """``timeout`` as a ``timedelta``: a ``timedelta``, seconds (int or float) or None
    (``default``). TypeError for any other type, ValueError for a duration that is not positive
    and finite (a NaN or infinite one would make every deadline test false)."""
    if timeout is None:
        return default
    if isinstance(timeout, timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise TypeError(f"timeout: expected datetime.timedelta, seconds (int or float) or None, got "
                        f"{type(timeout).__name__} {timeout!r}")
    if not seconds > 0 or math.isinf(seconds):
        raise ValueError(f"timeout: expected a positive, finite duration, got {timeout!r}")
    return timeout if isinstance(timeout, timedelta) else timedelta(seconds=seconds)
