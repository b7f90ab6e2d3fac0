"""A heal through torch: ``ndistrun --on-failure replace`` on backend "ndist" (issue 44, part 2).

3 ranks under a real ``ndistrun``, torch's rendezvous through ``ndist://``. Slot 1 SIGKILLs
itself once every rank's first all_reduce is done; the survivors name it
(``get_failed_ranks``), ``torch.distributed.shrink_group`` to 2, then call
``ndist.torch.grow_group()`` at each step boundary until it admits the replacement the
launcher started; the replacement's ``init_process_group`` returns once admitted, as rank 2
of 3 (``joined_running_job()``). Every member then runs a torch ``all_reduce`` of its slot
number on the grown default group: 0 + 1 + 2. Bad input to ``grow_group`` is refused before
any message, and the group stays usable."""

import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]

JOB = r"""
import os, signal, sys, time
from datetime import timedelta
import torch
import torch.distributed as dist
import ndist.torch

torch.set_num_threads(1)
slot, repl = int(os.environ["RANK"]), int(os.environ.get("NDIST_REPLACEMENT", "0"))
dist.init_process_group("ndist", init_method="ndist://", timeout=timedelta(seconds=60))
if ndist.torch.joined_running_job():
    print(f"slot {slot} replacement {repl} joined as rank {dist.get_rank()} of {dist.get_world_size()}", flush=True)
else:
    x = torch.ones(4)
    dist.all_reduce(x)
    assert x.tolist() == [3.0] * 4, x
    store = dist.distributed_c10d._get_default_store()
    if store.add("past", 1) == 3:  # (every rank is past its all_reduce: the victim may go)
        store.set("go", "1")
    if slot == 1:
        store.wait(["go"])
        os.kill(os.getpid(), signal.SIGKILL)
    for bad, kind in ((-1, ValueError), ("1s", TypeError)):
        try:
            ndist.torch.grow_group(timeout=bad)
        except kind as err:
            assert "timeout" in str(err), err
        else:
            raise AssertionError(f"grow_group(timeout={bad!r}) did not raise")
    try:
        for _ in range(1000):
            dist.all_reduce(x)
        raise AssertionError("the loss was never seen")
    except dist.DistNetworkError as err:
        print(f"slot {slot}: lost {ndist.torch.get_failed_ranks()}", flush=True)
    dist.shrink_group(ndist.torch.get_failed_ranks())
    deadline = time.monotonic() + 60
    while not (grown := ndist.torch.grow_group(timeout=30)):
        assert time.monotonic() < deadline, "no replacement came"
        y = torch.ones(2)
        dist.all_reduce(y)  # (a step on the shrunk group)
        assert y.tolist() == [2.0, 2.0], y
        time.sleep(0.05)
    print(f"slot {slot}: admitted {grown}: rank {dist.get_rank()} of {dist.get_world_size()}", flush=True)
t = torch.full((4,), float(slot))
dist.all_reduce(t)
assert t.tolist() == [3.0] * 4, t
print(f"slot {slot} replacement {repl} healed: rank {dist.get_rank()} of {dist.get_world_size()}, sum {t[0].item():g}",
      flush=True)
dist.destroy_process_group()
"""


def test_a_replacement_joins_torchs_default_group_and_all_reduce_is_right(tmp_path):
    (tmp_path / "job.py").write_text(JOB)
    cmd = [sys.executable, "-m", "ndist.launch", "--nproc-per-node", "3", "--on-failure", "replace", "job.py"]
    p = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "TMPDIR": str(tmp_path)}, start_new_session=True)
    try:
        out, err = p.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"the heal did not finish:\n{out}\n{err[-3000:]}")
    assert p.returncode == 0, out + err
    assert "[rank1]:slot 1 replacement 1 joined as rank 2 of 3" in out, out
    for s, rank in ((0, 0), (2, 1)):
        assert f"[rank{s}]:slot {s}: lost [1]" in out, out
        assert f"[rank{s}]:slot {s}: admitted [2]: rank {rank} of 3" in out, out
        assert f"[rank{s}]:slot {s} replacement 0 healed: rank {rank} of 3, sum 3" in out, out
    assert "[rank1]:slot 1 replacement 1 healed: rank 2 of 3, sum 3" in out, out
    assert "replaced rank 1 (replacement 1 of --max-restarts 3" in err, err
