"""``NDIST_DEBUG=INFO|DETAIL`` for the ranks: turn on the ``ndist`` loggers.

Called by ``init_process_group``. It adds a stderr handler to the ``ndist``
logger only when the variable is set and the application configured none, so
an application's own logging setup always wins.
"""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["configure_from_env", "DEBUG_ENV"]

DEBUG_ENV = "NDIST_DEBUG"
_LEVELS = {"INFO": logging.INFO, "DETAIL": logging.DEBUG, "DEBUG": logging.DEBUG, "WARNING": logging.WARNING}


def configure_from_env(rank: int | None = None) -> None:
    raw = os.environ.get(DEBUG_ENV, "").strip().upper()
    if not raw:
        return
    level = _LEVELS.get(raw)
    logger = logging.getLogger("ndist")
    if level is None:
        logger.warning("%s=%r is not one of %s; ignored", DEBUG_ENV, raw, sorted(_LEVELS))
        return
    logger.setLevel(level)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        who = f"rank {rank}" if rank is not None else f"pid {os.getpid()}"
        handler.setFormatter(logging.Formatter(f"[{who}] %(name)s %(levelname)s: %(message)s"))
        logger.addHandler(handler)
