import pickle

import pytest

import ndist


def test_forms():
    assert ndist.device("cpu").type == "cpu" and ndist.device("cpu").index is None
    d = ndist.device("cuda:1")
    assert (d.type, d.index) == ("cuda", 1)
    assert ndist.device("cuda", 1) == d
    assert ndist.device(1) == d
    assert ndist.device(d) == d
    assert ndist.device("cuda").index is None
    assert ndist.device("cpu:0").index == 0


def test_str_repr_eq_hash():
    assert repr(ndist.device("cuda", 0)) == "device(type='cuda', index=0)"
    assert repr(ndist.device("cpu")) == "device(type='cpu')"
    assert str(ndist.device("cuda:2")) == "cuda:2" and str(ndist.device("cuda")) == "cuda"
    assert ndist.device("cuda") != ndist.device("cuda:0")
    assert len({ndist.device("cuda:0"), ndist.device("cuda", 0), ndist.device("cpu")}) == 2
    assert ndist.device("cpu") != "cpu"
    assert pickle.loads(pickle.dumps(ndist.device("cuda:3"))) == ndist.device("cuda:3")


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "cuda:-1", "cuda:", "CPU", "mps", "cuda:1:2"])
def test_bad_strings_list_valid_forms(bad):
    with pytest.raises(ValueError) as info:
        ndist.device(bad)
    msg = str(info.value)
    assert "'cpu', 'cuda', 'cuda:N'" in msg and repr(bad) in msg or bad.split(":")[0] in msg


def test_bad_index_and_types():
    with pytest.raises(ValueError, match="cuda:-1"):
        ndist.device("cuda", -1)
    with pytest.raises(ValueError, match="only index 0"):
        ndist.device("cpu", 1)
    with pytest.raises(ValueError, match="already has an index"):
        ndist.device("cuda:0", 1)
    with pytest.raises(TypeError, match="float"):
        ndist.device(1.5)
    with pytest.raises(TypeError, match="index must be an int"):
        ndist.device("cuda", "1")


def test_factory_device_argument_names_itself():
    with pytest.raises(ValueError, match="^device: .*'gpu'"):
        ndist.zeros(2, device="gpu")
