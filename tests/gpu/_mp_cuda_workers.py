"""Child-side functions for tests/gpu/test_mp_cuda.py (importable by spawn)."""


def add_one_cuda(q, done):
    import cupy

    fn, args = q.get(timeout=60)
    arr = fn(*args)
    first = float(arr[0])
    arr += 1
    cupy.cuda.get_current_stream().synchronize()
    done.put(("ok", first, arr.shape))
    assert q.get(timeout=60) == "bye"  # keep the mapping until the parent has checked


def add_one_tensor(q, done):
    import cupy

    t = q.get(timeout=60)
    t._data += 1
    cupy.cuda.get_current_stream().synchronize()
    done.put(("ok", str(t.device)))
    assert q.get(timeout=60) == "bye"
