"""The chunk schedule of pipelined host staging (``ndist.collectives._staging_plan``)."""

from __future__ import annotations

import pytest

from ndist.collectives._backend import Op
from ndist.collectives._staging_plan import CHUNKED_OPS, Chunk, chunk_plan, chunk_step


def test_chunks_cover_the_buffer_in_order_through_rotating_slots():
    plan = chunk_plan(10 * 1024 + 512, 4, chunk_bytes=4096, depth=3)
    assert plan == [Chunk(0, 0, 4096, 0), Chunk(1, 4096, 4096, 1), Chunk(2, 8192, 2560, 2)]
    plan = chunk_plan(5 * 256, 8, chunk_bytes=256, depth=2)
    assert [c.slot for c in plan] == [0, 1, 0, 1, 0]
    assert sum(c.nbytes for c in plan) == 5 * 256
    assert all(b.offset == a.offset + a.nbytes for a, b in zip(plan, plan[1:]))


def test_a_small_or_empty_buffer():
    assert chunk_plan(100, 4, chunk_bytes=1 << 20) == [Chunk(0, 0, 100, 0)]
    assert chunk_plan(0, 4) == []


def test_chunk_boundaries_are_whole_elements_and_aligned():
    assert chunk_step(4, 1000) == 768  # 256-byte aligned
    assert chunk_step(16, 4096 + 100) == 4096
    assert chunk_step(8, 100) == 96  # under 256 bytes: whole elements
    assert chunk_step(2, 3) == 2
    for c in chunk_plan(6 * 1000, 6, chunk_bytes=1000):  # 6 does not divide 256: whole elements
        assert c.offset % 6 == 0 and c.nbytes % 6 == 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(nbytes=-1, itemsize=4), r"nbytes: expected an int >= 0, got -1"),
    (dict(nbytes=10, itemsize=4), r"nbytes: expected a multiple of the element size 4, got 10"),
    (dict(nbytes=8, itemsize=0), r"itemsize: expected a positive int, got 0"),
    (dict(nbytes=8, itemsize=8, chunk_bytes=4), r"chunk_bytes: expected an int >= the element size \(8 bytes\), got 4"),
    (dict(nbytes=8, itemsize=4, depth=0), r"depth: expected an int >= 1, got 0"),
])
def test_bad_arguments_name_themselves(kwargs, message):
    with pytest.raises(ValueError, match=message):
        chunk_plan(**kwargs)


def test_chunked_ops_are_the_single_buffer_elementwise_ones():
    assert CHUNKED_OPS == {Op.ALL_REDUCE, Op.REDUCE, Op.BROADCAST}


def test_the_default_chunk_size_cuts_a_buffer_in_a_few_pieces_within_bounds():
    from ndist.collectives._staging_plan import MAX_CHUNK, MIN_CHUNK, auto_chunk_bytes

    assert auto_chunk_bytes(4096) == MIN_CHUNK == 256 << 10
    assert auto_chunk_bytes(1 << 20) == 256 << 10  # 1 MiB: 4 chunks
    assert auto_chunk_bytes(16 << 20) == 4 << 20
    assert auto_chunk_bytes(64 << 20) == MAX_CHUNK == 4 << 20  # 16 chunks
    assert [c.nbytes for c in chunk_plan(1 << 20, 4)] == [256 << 10] * 4
    assert len(chunk_plan(64 << 20, 2)) == 16
    assert chunk_plan(4096, 4) == [Chunk(0, 0, 4096, 0)]
