"""The chunk schedule of pipelined host staging (``_staging.py``).

A large buffer staged through a CPU backend is cut into chunks; chunk ``k``'s
device-to-host copy, its exchange on the host and its host-to-device copy
overlap with its neighbours' (the copies run on the GPU's copy engines while
the host exchanges). Each chunk goes through one of ``depth`` pinned slots,
reused across chunks and calls: chunk ``k`` uses slot ``k % depth``, so the
copy of chunk ``k + depth`` into a slot waits for chunk ``k``'s copy out of it.

Chunking is valid where the operation is the same operation on every byte
range of one buffer, with the same ranges on every rank:

* ``all_reduce``, ``reduce``: element-wise reductions (every ``ReduceOp``,
  PREMUL_SUM's factor and AVG's division included) on chunk boundaries that
  are whole elements;
* ``broadcast``: the root's bytes, range by range.

Not chunked (one packed buffer per call, as before): operations with several
buffers or whose outputs interleave the ranks' inputs (all_gather,
reduce_scatter, gather, scatter, all_to_all, send/recv, whose peers may differ
in size). Pure Python, tested without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._backend import Op

__all__ = ["CHUNKED_OPS", "MIN_CHUNK", "MAX_CHUNK", "PIECES", "DEPTH", "Chunk", "auto_chunk_bytes", "chunk_step",
           "chunk_plan"]

#: operations whose staging is pipelined in chunks (the module docstring says why these)
CHUNKED_OPS = frozenset({Op.ALL_REDUCE, Op.REDUCE, Op.BROADCAST})
#: the default chunk size (``auto_chunk_bytes``): a buffer in PIECES chunks, each between
#: MIN_CHUNK and MAX_CHUNK bytes. Few chunks keep the host's per-exchange cost small; more
#: than one lets the copies overlap the exchange (the copies not hidden are about 1/PIECES of
#: them). Not yet tuned on a GPU (docs/gpu.md).
MIN_CHUNK = 256 << 10
MAX_CHUNK = 4 << 20
PIECES = 4
#: pinned slots per backend: one chunk copied in, one exchanged, one copied out
DEPTH = 3
_ALIGN = 256  # chunk boundaries on this many bytes when the chunk is at least that large


@dataclass(frozen=True)
class Chunk:
    """Chunk ``index``: bytes ``[offset, offset + nbytes)`` of the buffer, through pinned slot ``slot``."""

    index: int
    offset: int
    nbytes: int
    slot: int


def chunk_step(itemsize: int, chunk_bytes: int) -> int:
    """The chunk size used for elements of ``itemsize`` bytes: at most ``chunk_bytes``, a
    whole number of elements, and a multiple of 256 bytes when it is at least 256."""
    if not isinstance(itemsize, int) or itemsize < 1:
        raise ValueError(f"itemsize: expected a positive int, got {itemsize!r}")
    if not isinstance(chunk_bytes, int) or chunk_bytes < itemsize:
        raise ValueError(f"chunk_bytes: expected an int >= the element size ({itemsize} bytes), got {chunk_bytes!r}")
    if chunk_bytes >= _ALIGN and _ALIGN % itemsize == 0:
        return chunk_bytes - chunk_bytes % _ALIGN
    return chunk_bytes - chunk_bytes % itemsize


def auto_chunk_bytes(nbytes: int) -> int:
    """The default chunk size for a buffer of ``nbytes``: ``nbytes / PIECES`` within
    ``[MIN_CHUNK, MAX_CHUNK]`` (a function of the size alone: the same on every rank)."""
    return min(MAX_CHUNK, max(MIN_CHUNK, nbytes // PIECES))


def chunk_plan(nbytes: int, itemsize: int, chunk_bytes: int | None = None, depth: int = DEPTH) -> list[Chunk]:
    """The chunks of a buffer of ``nbytes`` (a whole number of ``itemsize`` elements), in order.

    ``chunk_bytes``: the chunk size (None: ``auto_chunk_bytes(nbytes)``). The same
    arguments give the same plan on every rank (the exchanges match chunk by
    chunk); an empty buffer has no chunk.
    """
    if not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"nbytes: expected an int >= 0, got {nbytes!r}")
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth: expected an int >= 1, got {depth!r}")
    step = chunk_step(itemsize, auto_chunk_bytes(nbytes) if chunk_bytes is None else chunk_bytes)
    if nbytes % itemsize:
        raise ValueError(f"nbytes: expected a multiple of the element size {itemsize}, got {nbytes}")
    return [Chunk(i, off, min(step, nbytes - off), i % depth) for i, off in enumerate(range(0, nbytes, step))]
