"""The job secret of ndist's data connections under torch: agreed through torch's store.

``$NDIST_SECRET`` when set (ndistrun sets it), else the secret a rendezvous already agreed
on (``ndist://``: ``use``), else the first rank's random one; the first one stored wins,
on every rank. It is as private as torch's store is. The backend's creator
(``_backend.create``) and the ``ndist://`` rendezvous (``_rendezvous``) both use it.
"""

from __future__ import annotations

import os
import secrets
import threading

from ..runtime import _net

__all__ = ["use", "agree"]

_KEY = "ndist/secret"
_lock = threading.Lock()
_secret: str | None = None


def use(secret: str) -> None:
    """The secret a rendezvous already agreed on (``ndist://``): proposed first."""
    global _secret
    with _lock:
        _secret = secret


def agree(store) -> None:
    """Every member proposes its secret; the first one stored wins, on every rank."""
    global _secret
    with _lock:
        mine = os.environ.get(_net.SECRET_ENV) or _secret or secrets.token_hex(16)
        agreed = store.compare_set(_KEY, "", mine).decode()
        _net.set_job_secret(agreed)
        _secret = agreed
