"""repr checked against torch 2.13's output for the same calls (torch. -> ndist.)."""

import pytest

import ndist

T = ndist
CASES = [
    (lambda: T.tensor([0]), "tensor([0])"),
    (lambda: T.tensor([10, 11, 12]), "tensor([10, 11, 12])"),
    (lambda: T.tensor([-1, 100, 3]), "tensor([ -1, 100,   3])"),
    (lambda: T.tensor([0.5, 1.0]), "tensor([0.5000, 1.0000])"),
    (lambda: T.tensor([1.0, 2.0, 3.0]), "tensor([1., 2., 3.])"),
    (lambda: T.tensor([0.0, -0.0, 1.0]), "tensor([0., -0., 1.])"),
    (lambda: T.tensor([1.5, 2.25, -3.125]), "tensor([ 1.5000,  2.2500, -3.1250])"),
    (lambda: T.tensor([1e-5, 1.0]), "tensor([1.0000e-05, 1.0000e+00])"),
    (lambda: T.tensor([1e10, 2e10]), "tensor([1.0000e+10, 2.0000e+10])"),
    (lambda: T.tensor([float("nan"), float("inf"), 1.0]), "tensor([nan, inf, 1.])"),
    (lambda: T.tensor([float("nan"), float("inf"), -float("inf"), 1.5]),
     "tensor([   nan,    inf,   -inf, 1.5000])"),
    (lambda: T.tensor(3.5), "tensor(3.5000)"),
    (lambda: T.tensor(3.0), "tensor(3.)"),
    (lambda: T.tensor(7), "tensor(7)"),
    (lambda: T.tensor([True, False]), "tensor([ True, False])"),
    (lambda: T.tensor([1 + 1j], dtype=T.cfloat), "tensor([1.+1.j])"),
    (lambda: T.tensor([1.5 + 2j, -3 - 4.25j]), "tensor([ 1.5000+2.0000j, -3.0000-4.2500j])"),
    (lambda: T.tensor([1 + 1j], dtype=T.cdouble), "tensor([1.+1.j], dtype=ndist.complex128)"),
    (lambda: T.tensor([1, 2], dtype=T.int32), "tensor([1, 2], dtype=ndist.int32)"),
    (lambda: T.tensor([1, 2], dtype=T.float64), "tensor([1., 2.], dtype=ndist.float64)"),
    (lambda: T.tensor([1.3333, 2], dtype=T.float16), "tensor([1.3330, 2.0000], dtype=ndist.float16)"),
    (lambda: T.tensor([], dtype=T.int64), "tensor([], dtype=ndist.int64)"),
    (lambda: T.tensor([]), "tensor([])"),
    (lambda: T.zeros(0, 3), "tensor([], size=(0, 3))"),
    (lambda: T.zeros(2, 0, dtype=T.int32), "tensor([], size=(2, 0), dtype=ndist.int32)"),
    (lambda: T.tensor([[1, 2], [3, 44]]), "tensor([[ 1,  2],\n        [ 3, 44]])"),
    (lambda: T.tensor([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.5]]]),
     "tensor([[[1.0000, 2.0000],\n         [3.0000, 4.0000]],\n\n"
     "        [[5.0000, 6.0000],\n         [7.0000, 8.5000]]])"),
    (lambda: T.arange(2000), "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])"),
    (lambda: T.arange(30, dtype=T.float64)[:12] / 7,
     "tensor([0.0000, 0.1429, 0.2857, 0.4286, 0.5714, 0.7143, 0.8571, 1.0000, 1.1429,\n"
     "        1.2857, 1.4286, 1.5714], dtype=ndist.float64)"),
    (lambda: T.arange(3000).reshape(30, 100),
     "tensor([[   0,    1,    2,  ...,   97,   98,   99],\n"
     "        [ 100,  101,  102,  ...,  197,  198,  199],\n"
     "        [ 200,  201,  202,  ...,  297,  298,  299],\n"
     "        ...,\n"
     "        [2700, 2701, 2702,  ..., 2797, 2798, 2799],\n"
     "        [2800, 2801, 2802,  ..., 2897, 2898, 2899],\n"
     "        [2900, 2901, 2902,  ..., 2997, 2998, 2999]])"),
]


@pytest.mark.parametrize("i", range(len(CASES)))
def test_repr_matches_torch(i):
    make, want = CASES[i]
    assert repr(make()) == want


def test_seed_all_to_all_page_lines():
    # The all_to_all page's integer examples print exactly as shown there.
    rank = 1
    inp = ndist.arange(4) + rank * 4
    assert repr(list(inp.chunk(4))) == "[tensor([4]), tensor([5]), tensor([6]), tensor([7])]"
    x = ndist.tensor([10, 11, 12, 13, 14, 15, 16, 17, 18])
    assert repr(list(x.split([3, 2, 2, 2]))) == \
        "[tensor([10, 11, 12]), tensor([13, 14]), tensor([15, 16]), tensor([17, 18])]"
    # Complex: torch 2.x prints tensor([5.+5.j]); the page's "tensor([5+5j])" is hand-written.
    c = ndist.tensor([1 + 1j, 2 + 2j, 3 + 3j, 4 + 4j], dtype=ndist.cfloat) + 4 * rank * (1 + 1j)
    assert repr(list(c.chunk(4))) == \
        "[tensor([5.+5.j]), tensor([6.+6.j]), tensor([7.+7.j]), tensor([8.+8.j])]"


def test_printoptions():
    try:
        ndist.set_printoptions(precision=2)
        assert repr(ndist.tensor([0.5, 1.0])) == "tensor([0.50, 1.00])"
        ndist.set_printoptions(threshold=5, edgeitems=1)
        assert repr(ndist.arange(10)) == "tensor([0,  ..., 9])"
        ndist.set_printoptions(sci_mode=True, profile="default")
        assert repr(ndist.tensor([0.5])) == "tensor([5.0000e-01])"
    finally:
        ndist.set_printoptions(profile="default")
    assert repr(ndist.tensor([0.5])) == "tensor([0.5000])"
    with pytest.raises(ValueError, match="profile"):
        ndist.set_printoptions(profile="huge")


def test_format_of_0d():
    assert f"{ndist.tensor(2.5):.1f}" == "2.5"
    assert str(ndist.tensor([1, 2])) == "tensor([1, 2])"
