"""FileStore across real processes."""

import multiprocessing as mp

import pytest

from ndist.runtime import DistTimeoutError, FileStore

ctx = mp.get_context("spawn")


def _worker(path, rank, world, q):
    try:
        s = FileStore(path, world)
        s.add("counter", 1)
        s.set(f"rank/{rank}", str(rank * 10))
        s.wait([f"rank/{r}" for r in range(world)], 60)
        q.put((rank, s.get(f"rank/{(rank + 1) % world}"), s.get("counter")))
        s.close()
    except BaseException as err:
        q.put((rank, "error", repr(err)))


@pytest.mark.timeout(120)
def test_processes_share_a_file_store_and_the_last_user_removes_it(tmp_path):
    path = str(tmp_path / "fs")
    world = 3
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(path, r, world, q)) for r in range(world)]
    for p in procs:
        p.start()
    results = sorted(q.get(timeout=90) for _ in range(world))
    for p in procs:
        p.join(30)
    assert [r[1] for r in results] == [b"10", b"20", b"0"]
    assert all(r[2] == b"3" for r in results)
    assert not (tmp_path / "fs").exists()


def test_file_kept_with_unknown_world_size(tmp_path):
    s = FileStore(tmp_path / "keep")
    s.set("a", "1")
    s2 = FileStore(tmp_path / "keep")
    assert s2.get("a") == b"1"
    assert s2.num_keys() == 1  # internal bookkeeping keys are not counted
    s.close()
    s2.close()
    assert (tmp_path / "keep").exists()


def test_timeout_names_missing_key(tmp_path):
    s = FileStore(tmp_path / "t", timeout=0.1)
    with pytest.raises(DistTimeoutError, match="nope"):
        s.get("nope")
    s.close()


def test_argument_checks(tmp_path):
    with pytest.raises(ValueError, match="world_size"):
        FileStore(tmp_path / "x", 0)
    with pytest.raises(TypeError, match="path"):
        FileStore(None)
