"""ndist.tensor._shm: shared segments, strategies and their lifetime (NumPy only)."""

import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ndist.tensor import _shm
from tests.sharing import file_system, strategy  # noqa: F401 - fixtures


def shm_names(pid):
    prefix = f"ndist_mp_{pid}_"
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))


def test_strategies():
    assert isinstance(_shm.get_all_strategies(), set)
    assert _shm.get_strategy() in _shm.get_all_strategies()
    if sys.platform.startswith("linux"):
        assert _shm.get_all_strategies() == {"file_descriptor", "file_system"}
        assert _shm.get_strategy() == "file_descriptor"


def test_set_strategy_rejects_unknown_name_listing_valid_ones():
    with pytest.raises(ValueError, match=r"new_strategy.*file_system.*'bogus'"):
        _shm.set_strategy("bogus")
    with pytest.raises(ValueError, match="new_strategy"):
        _shm.set_strategy(None)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.complex128, np.uint8])
def test_share_array_copies_contents_into_shared_memory(strategy, dtype):
    src = (np.arange(24) % 5).astype(dtype).reshape(2, 3, 4)
    out = _shm.share_array(src)
    assert out is not src and not np.shares_memory(out, src)
    assert out.dtype == src.dtype and out.shape == src.shape
    np.testing.assert_array_equal(out, src)
    assert _shm.is_shared(out) and not _shm.is_shared(src)
    seg, offset = _shm.segment_of(out)
    assert seg.strategy == strategy and offset == 0


def test_share_array_of_non_contiguous_view_and_empty(strategy):
    src = np.arange(30.0).reshape(5, 6)[::2, 1::2]
    out = _shm.share_array(src)
    np.testing.assert_array_equal(out, src)
    assert out.flags.c_contiguous
    empty = _shm.share_array(np.zeros((0, 3), np.float32))
    assert empty.shape == (0, 3) and _shm.is_shared(empty)


def test_views_of_shared_arrays_are_shared_and_offsets_are_in_bytes(strategy):
    out = _shm.share_array(np.arange(20, dtype=np.int32).reshape(4, 5))
    assert _shm.share_array(out) is out  # already shared: no copy
    view = out[1:, ::-1]
    assert _shm.is_shared(view) and _shm.share_array(view) is view
    seg, offset = _shm.segment_of(view)
    assert offset == (1 * 5 + 4) * 4
    rebuilt = _shm.array_from_segment(seg, offset, view.shape, view.strides, view.dtype)
    np.testing.assert_array_equal(rebuilt, view)
    rebuilt[0, 0] = -7
    assert out[1, 4] == -7


def test_bad_inputs_raise_type_error_naming_arr():
    with pytest.raises(TypeError, match="arr must be a numpy.ndarray, got list"):
        _shm.share_array([1, 2])
    with pytest.raises(TypeError, match="arr must be a numpy.ndarray"):
        _shm.is_shared("x")
    with pytest.raises(TypeError, match="fixed-size dtype.*object"):
        _shm.share_array(np.array([object()]))


def test_file_system_name_is_unlinked_with_the_last_view(file_system):
    before = shm_names(os.getpid())
    out = _shm.share_array(np.ones(100))
    view = out[10:20]
    (name,) = set(shm_names(os.getpid())) - set(before)
    assert _shm.segment_of(out)[0].name == name
    del out
    gc.collect()
    assert name in shm_names(os.getpid())  # the view still holds it
    del view
    gc.collect()
    assert name not in shm_names(os.getpid())


def test_in_flight_handle_keeps_the_name_until_received(file_system):
    out = _shm.share_array(np.arange(8.0))
    seg = _shm.segment_of(out)[0]
    name, nbytes = seg.name, seg.nbytes
    _shm.pin(seg)  # as the sender does when it serializes a handle
    del out, seg
    gc.collect()
    assert name in shm_names(os.getpid())
    received = _shm.open_name(name, nbytes)
    _shm.unpin(received)
    arr = _shm.array_from_segment(received, 0, (8,), (8,), np.float64)
    np.testing.assert_array_equal(arr, np.arange(8.0))
    del arr, received
    gc.collect()
    assert name not in shm_names(os.getpid())


def test_open_name_of_missing_segment_explains():
    with pytest.raises(RuntimeError, match="no longer exists"):
        _shm.open_name("ndist_mp_1_1_0_deadbeef", 8)


_CHILD = textwrap.dedent(
    """
    import sys, time, numpy as np
    from ndist.tensor import _shm
    _shm.set_strategy("file_system")
    arr = _shm.share_array(np.ones(4096))
    if sys.argv[1] == "pin":
        _shm.pin(_shm.segment_of(arr)[0])
    print(_shm.segment_of(arr)[0].name, flush=True)
    if sys.argv[1] == "wait":
        time.sleep(600)
    """
)


def _run_child(mode):
    return subprocess.Popen([sys.executable, "-c", _CHILD, mode], stdout=subprocess.PIPE, text=True)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["exit", "pin"])
def test_exiting_process_leaves_no_segment(mode):
    # A root process reclaims its own segments at exit, in-flight ones included.
    proc = _run_child(mode)
    name = proc.stdout.readline().strip()
    assert proc.wait(30) == 0
    assert name.startswith(f"ndist_mp_{proc.pid}_")
    assert shm_names(proc.pid) == []


@pytest.mark.timeout(60)
def test_reclaim_after_sigkill():
    proc = _run_child("wait")
    name = proc.stdout.readline().strip()
    assert shm_names(proc.pid) == [name]
    assert _shm.reclaim([proc.pid]) == 0  # alive: not touched
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    assert shm_names(proc.pid) == [name]  # nobody unlinked it ...
    assert _shm.reclaim([proc.pid]) == 1  # ... until the parent cleans up
    assert shm_names(proc.pid) == []


@pytest.mark.timeout(60)
def test_reclaim_leaves_a_segment_another_process_maps(file_system):
    proc = _run_child("wait")
    name = proc.stdout.readline().strip()
    held = _shm.open_name(name, 4096 * 8)
    proc.kill()
    proc.wait(30)
    assert _shm.reclaim([proc.pid]) == 0
    assert shm_names(proc.pid) == [name]
    np.testing.assert_array_equal(_shm.array_from_segment(held, 0, (4096,), (8,), np.float64), 1.0)
    del held
    gc.collect()
    assert shm_names(proc.pid) == []  # this process was the last holder


def _forked_child(arr, go, done):
    go.wait(30)
    arr[0] = 42.0  # the parent already dropped its reference
    done.set()


@pytest.mark.timeout(60)
def test_fork_child_holds_its_own_reference(file_system):
    ctx = multiprocessing.get_context("fork")
    arr = _shm.share_array(np.zeros(16))
    view = arr[:4]
    name = _shm.segment_of(arr)[0].name
    go, done = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_forked_child, args=(arr, go, done))
    p.start()
    del arr
    gc.collect()
    view_keep = view.copy()
    del view
    gc.collect()
    assert name in shm_names(os.getpid())  # the forked child still holds it
    go.set()
    assert done.wait(30)
    p.join(30)
    assert p.exitcode == 0
    assert name not in shm_names(os.getpid())
    assert view_keep[0] == 0.0


def test_full_tmpfs_raises_memory_error_instead_of_sigbus():
    size = 1 << 50  # 1 PiB: more than any /dev/shm, refused before a page is touched
    before = shm_names(os.getpid())
    with pytest.raises(MemoryError, match=r"cannot allocate 1125899906842688 bytes of /dev/shm"):
        _shm._create_segment(size, "file_system")
    assert shm_names(os.getpid()) == before


def test_array_over_a_memoryview_of_a_segment_is_shared(strategy):
    out = _shm.share_array(np.arange(4, dtype=np.uint8))
    seg = _shm.segment_of(out)[0]
    again = np.frombuffer(memoryview(seg), dtype=np.uint8, count=4, offset=seg.data_offset)
    assert _shm.is_shared(again) and _shm.segment_of(again) == (seg, 0)


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    dtype=st.sampled_from(["<f8", "<i4", "u1", ">i2", "<c8", "?"]),
    data=st.data(),
)
def test_any_view_round_trips_through_a_segment(shape, dtype, data):
    name = data.draw(st.sampled_from(sorted(_shm.get_all_strategies())))
    old = _shm.get_strategy()
    _shm.set_strategy(name)
    try:
        out = _shm.share_array((np.arange(np.prod(shape)) % 7).astype(dtype).reshape(shape))
    finally:
        _shm.set_strategy(old)
    index = tuple(
        slice(data.draw(st.integers(0, n - 1)), None, data.draw(st.sampled_from([1, 2, -1]))) for n in shape
    )
    view = out[index]
    seg, offset = _shm.segment_of(view)
    again = _shm.array_from_segment(seg, offset, view.shape, view.strides, view.dtype)
    np.testing.assert_array_equal(again, view)
    assert np.shares_memory(again, view) or view.size == 0


def test_open_checks_names_and_sizes(file_system):
    for bad in ("../../etc/passwd", "ndist_mp_x", "other_segment"):
        with pytest.raises(ValueError, match="name must be an ndist segment name"):
            _shm.open_name(bad, 8)
    arr = _shm.share_array(np.zeros(4))
    seg = _shm.segment_of(arr)[0]
    _shm._by_key.pop(seg.key, None)  # as in another process: not in the cache, opened by name
    with pytest.raises(ValueError, match="nbytes must be at most the segment's size 32, got 33"):
        _shm.open_name(seg.name, 33)


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="needs memfd")
def test_open_fd_checks_size():
    fd = os.memfd_create("t")
    os.ftruncate(fd, 16)
    with pytest.raises(ValueError, match="nbytes must be at most the segment's size 16, got 17"):
        _shm.open_fd(fd, 17)
    with pytest.raises(OSError):
        os.fstat(fd)  # taken and closed
