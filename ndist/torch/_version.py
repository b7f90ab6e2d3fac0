"""The torch releases ``ndist.torch`` supports, checked when it is imported.

``ndist.torch`` subclasses torch's ``ProcessGroup`` and ``Work`` in Python and relies on
how torch's ``distributed_c10d`` calls a Python backend: the methods and their argument
layouts, ``Backend.register_backend(..., extended_api=True, devices=...)``, the
``_DistributedBackendOptions`` a creator receives, the group name and description
setters, ``_coalescing_manager``'s ``start_coalescing`` / ``end_coalescing``, the
``*_coalesced`` methods, ``_get_backend`` (2.14's ``batch_isend_irecv`` asks for it), the
names its functional collectives resolve, and the private steps of ``shrink_group``
(``_shrink.install``). These change between torch releases, so the range is the releases
``.ci/run`` runs (torch's own suite, ``tests/torch_suite``, and ``pytest -m torch``: on the
newest all of it, on the other the tests marked ``every_torch_release``): 2.13 and 2.14.
``check`` turns any other version, older or newer, into an ``ImportError`` that names the
installed and the supported versions, instead of a failure in the middle of a program
(docs/torch.md, "Supported torch releases").
"""

from __future__ import annotations

import re

__all__ = ["RELEASES", "SUPPORTED", "MINIMUM", "BELOW", "check", "parse"]

#: the torch releases (major, minor) CI runs, oldest first: each one supported
RELEASES = ((2, 13), (2, 14))
MINIMUM = RELEASES[0]  #: the oldest torch release supported
BELOW = (RELEASES[-1][0], RELEASES[-1][1] + 1)  #: the first release not supported
SUPPORTED = f">={MINIMUM[0]}.{MINIMUM[1]},<{BELOW[0]}.{BELOW[1]}"  #: as pyproject's ``torch`` extra states it
_NAMES = " and ".join(f"{major}.{minor}" for major, minor in RELEASES)  #: "2.13 and 2.14"

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
    """Raise ImportError unless torch ``version`` is one of ``RELEASES`` (a pre-release or
    local build counts as its release: ``2.14.0a0`` is 2.14; ``2.15.0a0`` is refused)."""
    try:
        release = parse(version)
    except ValueError:
        release = None
    if release not in RELEASES:
        raise ImportError(
            f"ndist.torch supports torch {SUPPORTED} (torch {_NAMES}); torch {version} is installed. "
            f"Install a supported torch (pip install 'ndist[torch]'), or use ndist without ndist.torch."
        )
