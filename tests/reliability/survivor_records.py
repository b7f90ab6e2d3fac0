"""What a survivor of a rank loss returns about the operation it ran: ``tests.kill_sync.record``
of the ``DistError`` it raised, or of its success (the time it ended, either way)."""

from ndist.runtime import DistError
from tests.kill_sync import record


def record_of(op, errors=DistError) -> dict:
    """``op()``'s ``record``: ``record(err)`` of an error of type ``errors``, ``record()`` when
    it returns."""
    try:
        op()
    except errors as err:
        return record(err)
    return record()
