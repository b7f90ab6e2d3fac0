"""``NDIST_DEBUG=INFO|DETAIL``: send the ``ndist.*`` logs of this process to stderr."""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["debug_level", "configure_logging"]

_done = False


def debug_level() -> str:
    """``NDIST_DEBUG`` upper-cased (``""`` when unset)."""
    return os.environ.get("NDIST_DEBUG", "").strip().upper()


def configure_logging() -> None:
    """Attach one stderr handler to the ``ndist`` logger when ``NDIST_DEBUG`` is INFO or
    DETAIL (DEBUG level for DETAIL). Idempotent; does nothing otherwise."""
    global _done
    if _done:
        return
    _done = True
    level = debug_level()
    if level not in ("INFO", "DETAIL"):
        return
    root = logging.getLogger("ndist")
    root.setLevel(logging.DEBUG if level == "DETAIL" else logging.INFO)
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[ndist pid %(process)d] %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
