"""Property tests: basic indexing, permute, transpose, expand, split and reshape give
the same values as NumPy and (where torch makes a view) write through to the base."""

import numpy as np
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import ndist

shapes = hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=5)


@st.composite
def basic_index(draw, shape):
    idx = []
    for n in shape[:draw(st.integers(1, len(shape)))]:
        kind = draw(st.sampled_from(["int", "slice", "full"]))
        if kind == "int":
            idx.append(draw(st.integers(-n, n - 1)))
        elif kind == "slice":
            start = draw(st.integers(0, n))
            idx.append(slice(start, draw(st.integers(start, n)), draw(st.integers(1, 3))))
        else:
            idx.append(slice(None))
    if draw(st.booleans()):  # a new axis consumes no dimension
        idx.insert(draw(st.integers(0, len(idx))), None)
    return tuple(idx)


@settings(max_examples=80, deadline=None)
@given(st.data(), shapes)
def test_basic_indexing_is_a_view(data, shape):
    base = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    t = ndist.tensor(base)
    idx = data.draw(basic_index(shape))
    v = t[idx]
    np.testing.assert_array_equal(v.numpy(), base[idx])
    if v.numel():
        v.fill_(-1)  # writes through to the base tensor
        assert (t.numpy()[idx] == -1).all()
        assert (t.numpy() == -1).sum() == np.unique(base[idx]).size


@settings(max_examples=60, deadline=None)
@given(st.data(), shapes)
def test_permute_transpose_expand_match_numpy(data, shape):
    base = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    t = ndist.from_numpy(base)
    perm = data.draw(st.permutations(range(len(shape))))
    p = t.permute(*perm)
    np.testing.assert_array_equal(p.numpy(), base.transpose(perm))
    assert np.shares_memory(p.numpy(), base)
    d0, d1 = data.draw(st.integers(-len(shape), len(shape) - 1)), data.draw(st.integers(0, len(shape) - 1))
    np.testing.assert_array_equal(t.transpose(d0, d1).numpy(), np.swapaxes(base, d0, d1))
    target = tuple(data.draw(st.integers(1, 3)) if s == 1 else s for s in shape)
    lead = data.draw(st.integers(0, 2))
    e = t.expand((2,) * lead + target)
    np.testing.assert_array_equal(e.numpy(), np.broadcast_to(base, (2,) * lead + target))
    assert np.shares_memory(e.numpy(), base)


@settings(max_examples=60, deadline=None)
@given(st.data(), shapes)
def test_split_chunk_reshape(data, shape):
    base = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    t = ndist.from_numpy(base)
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    n = shape[dim]
    size = data.draw(st.integers(1, n))
    parts = t.split(size, dim)
    assert sum(p.shape[dim] for p in parts) == n
    np.testing.assert_array_equal(ndist.cat(list(parts), dim).numpy(), base)
    chunks = data.draw(st.integers(1, 6))
    np.testing.assert_array_equal(ndist.cat(list(t.chunk(chunks, dim)), dim).numpy(), base)
    assert len(t.chunk(chunks, dim)) <= chunks
    sizes = data.draw(st.lists(st.integers(0, n), min_size=1, max_size=4).filter(lambda s: sum(s) == n)
                      | st.just([n]))
    np.testing.assert_array_equal(ndist.cat(list(t.split(sizes, dim)), dim).numpy(), base)
    flat = t.reshape(-1)
    np.testing.assert_array_equal(flat.numpy(), base.reshape(-1))
    assert np.shares_memory(flat.numpy(), base)  # contiguous: reshape is a view
