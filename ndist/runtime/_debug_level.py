"""torch's ``DebugLevel`` / ``get_debug_level`` / ``set_debug_level`` /
``set_debug_level_from_env`` over ndist's ``NDIST_DEBUG``.

The level is ``NDIST_DEBUG`` (``OFF`` / ``INFO`` / ``DETAIL``; ``DEBUG``, which
only makes the logs verbose, counts as INFO) unless ``set_debug_level`` chose one; ``set_debug_level_from_env``
goes back to the variable. DETAIL turns on the per-call signature check of
groups created afterwards; INFO and DETAIL also raise the ``ndist`` logger's
level (the handler is the application's: see ``_log``). Library code never
writes ``os.environ``, so ``set_debug_level`` does not change the variable.
"""

from __future__ import annotations

import enum
import logging
import os

from ._log import DEBUG_ENV

__all__ = ["DebugLevel", "get_debug_level", "set_debug_level", "set_debug_level_from_env"]


class DebugLevel(enum.IntEnum):
    """torch.distributed.DebugLevel: OFF, INFO, DETAIL."""

    OFF = 0
    INFO = 1
    DETAIL = 2


_override: DebugLevel | None = None
_FROM_ENV = {"": DebugLevel.OFF, "OFF": DebugLevel.OFF, "WARNING": DebugLevel.OFF, "INFO": DebugLevel.INFO,
             "DETAIL": DebugLevel.DETAIL, "DEBUG": DebugLevel.INFO}


def _from_env() -> DebugLevel:
    # Unknown values count as OFF; init_process_group's logger setup warns about them.
    return _FROM_ENV.get(os.environ.get(DEBUG_ENV, "").strip().upper(), DebugLevel.OFF)


def get_debug_level() -> DebugLevel:
    """The level set by ``set_debug_level``, else the one ``NDIST_DEBUG`` says."""
    return _override if _override is not None else _from_env()


def _apply(level: DebugLevel) -> None:
    if level is not DebugLevel.OFF:
        logging.getLogger("ndist").setLevel(logging.DEBUG if level is DebugLevel.DETAIL else logging.INFO)


def set_debug_level(level: DebugLevel) -> None:
    """Use ``level`` from now on (groups created afterwards see DETAIL)."""
    global _override
    if isinstance(level, bool) or not isinstance(level, int) or level not in DebugLevel._value2member_map_:
        raise TypeError(f"level: expected a DebugLevel (OFF, INFO, DETAIL), got {level!r}")
    _override = DebugLevel(level)
    _apply(_override)


def set_debug_level_from_env() -> None:
    """Forget ``set_debug_level``'s choice and follow ``NDIST_DEBUG`` again."""
    global _override
    _override = None
    _apply(_from_env())
