"""The torch versions ``ndist.torch`` supports, checked when it is imported.

``ndist.torch`` subclasses torch's ``ProcessGroup`` and ``Work`` in Python and relies on
how torch's ``distributed_c10d`` calls a Python backend: the methods and their argument
layouts, ``Backend.register_backend(..., extended_api=True, devices=...)``, the
``_DistributedBackendOptions`` a creator receives, the group name and description
setters, ``_coalescing_manager``'s ``start_coalescing`` / ``end_coalescing`` and the
``*_coalesced`` methods, the names its functional collectives resolve. These change
between torch releases, so the range is the releases the whole torch suite
(``pytest -m torch``) passed on: torch 2.13. (On torch 2.14.1 all of it but one test
passed: 2.14's ``batch_isend_irecv`` asks the group for its C++ backend,
``group._get_backend(device)``, which a group written in Python does not have, and
raises.) ``check`` turns any other version into an ``ImportError`` that names the
installed and the supported versions, instead of a failure in the middle of a program.
"""

from __future__ import annotations

import re

__all__ = ["SUPPORTED", "MINIMUM", "BELOW", "check", "parse"]

MINIMUM = (2, 13)  #: the oldest torch release supported (its major, minor)
BELOW = (2, 14)  #: the first release not supported
SUPPORTED = f">={MINIMUM[0]}.{MINIMUM[1]},<{BELOW[0]}.{BELOW[1]}"  #: as pyproject's ``torch`` extra states it

_RELEASE = re.compile(r"(\d+)\.(\d+)")


def parse(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a torch version string (``"2.13.0+cpu"``, ``"2.14.0a0+git1234"``,
    ``"2.14.0.dev20260101"``); ValueError if it does not start with them."""
    if not isinstance(version, str):
        raise TypeError(f"version: expected a version string, got {type(version).__name__}")
    m = _RELEASE.match(version.strip())
    if m is None:
        raise ValueError(f"version: expected a torch version such as '2.13.0', got {version!r}")
    return int(m.group(1)), int(m.group(2))


def check(version: str) -> None:
    """Raise ImportError unless torch ``version`` is in ``SUPPORTED`` (a pre-release or
    local build counts as its release: ``2.13.0a0`` is 2.13)."""
    try:
        release = parse(version)
    except ValueError:
        release = None
    if release is None or not MINIMUM <= release < BELOW:
        raise ImportError(
            f"ndist.torch supports torch {SUPPORTED} (torch 2.13); torch {version} is installed. "
            f"Install a supported torch (pip install 'ndist[torch]'), or use ndist without ndist.torch."
        )
