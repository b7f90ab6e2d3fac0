"""Store semantics, run once per store kind (HashStore, TCPStore, FileStore, PrefixStore)."""

import threading

import pytest

from ndist.runtime import DistTimeoutError, FileStore, HashStore, PrefixStore, TCPStore


@pytest.fixture(params=["hash", "tcp", "file", "prefix"])
def store(request, tmp_path):
    kind = request.param
    if kind == "hash":
        s = HashStore(timeout=5)
    elif kind == "tcp":
        s = TCPStore("127.0.0.1", 0, is_master=True, timeout=5, secret="test-secret")
    elif kind == "file":
        s = FileStore(tmp_path / "store", timeout=5)
    else:
        inner = HashStore(timeout=5)
        inner.set("outside", "x")
        s = PrefixStore("grp", inner)
    yield s
    s.close()


pytestmark = pytest.mark.timeout(60)


def test_set_get_roundtrip_bytes_and_str(store):
    store.set("k", b"\x00\xffbin")
    store.set("s", "text")
    assert store.get("k") == b"\x00\xffbin"
    assert store.get("s") == b"text"
    store.set("k", b"")
    assert store.get("k") == b""


def test_add_counts_from_zero_and_returns_new_value(store):
    assert store.add("c", 1) == 1
    assert store.add("c", 5) == 6
    assert store.add("c", -10) == -4
    assert store.get("c") == b"-4"


def test_compare_set_semantics(store):
    # absent + empty expected: set
    assert store.compare_set("cs", "", "a") == b"a"
    # wrong expected: unchanged, returns current
    assert store.compare_set("cs", "zzz", "b") == b"a"
    assert store.get("cs") == b"a"
    # right expected: swapped
    assert store.compare_set("cs", "a", "b") == b"b"
    # absent + non-empty expected: returns expected, key stays absent
    assert store.compare_set("absent", "e", "d") == b"e"
    assert not store.check(["absent"])


def test_wait_timeout_names_missing_keys(store):
    store.set("here", "1")
    with pytest.raises(DistTimeoutError) as info:
        store.wait(["here", "missing-1", "missing-2"], 0.2)
    msg = str(info.value)
    assert "missing-1" in msg and "missing-2" in msg
    assert "'here'" not in msg


def test_get_times_out_with_store_timeout(store):
    store.set_timeout(0.2)
    with pytest.raises(DistTimeoutError, match="never-set"):
        store.get("never-set")


def test_wait_returns_when_another_thread_sets(store):
    t = threading.Timer(0.1, store.set, args=("late", "v"))
    t.start()
    store.wait(["late"], 10)
    t.join()
    assert store.get("late") == b"v"


def test_check_delete_and_num_keys(store):
    base = store.num_keys()
    assert not store.check(["a"])
    store.set("a", "1")
    store.set("b", "2")
    assert store.check(["a", "b"]) and not store.check(["a", "c"])
    assert store.num_keys() == base + 2
    assert store.delete_key("a") is True
    assert store.delete_key("a") is False
    assert not store.check(["a"])
    assert store.num_keys() == base + 1


def test_multi_get_multi_set_and_append(store):
    store.multi_set(["x", "y"], [b"1", "2"])
    assert store.multi_get(["y", "x"]) == [b"2", b"1"]
    store.append("log", "ab")
    store.append("log", b"cd")
    assert store.get("log") == b"abcd"
    with pytest.raises(ValueError, match="values"):
        store.multi_set(["x", "y"], [b"1"])


def test_bad_arguments_are_type_errors(store):
    with pytest.raises(TypeError, match="key"):
        store.set(3, "v")
    with pytest.raises(TypeError, match="value"):
        store.set("k", 3.5)
    with pytest.raises(TypeError, match="amount"):
        store.add("k", "1")


def test_prefix_store_isolates_namespaces():
    inner = HashStore(timeout=1)
    a, b = PrefixStore("a", inner), PrefixStore("b", inner)
    a.set("k", "from-a")
    b.set("k", "from-b")
    assert a.get("k") == b"from-a" and b.get("k") == b"from-b"
    assert inner.get("a/k") == b"from-a"
    nested = PrefixStore("n", a)
    nested.set("k", "deep")
    assert inner.get("a/n/k") == b"deep"
    with pytest.raises(DistTimeoutError, match="a/missing"):
        a.wait(["missing"], 0.1)
    with pytest.raises(TypeError, match="store"):
        PrefixStore("p", object())
